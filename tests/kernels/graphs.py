"""CUDA-graph capture for the GPU tests: warm up on a side stream, capture one call, hand back the graph."""

from __future__ import annotations

import torch


def capture(fn):
    """-> (graph, the captured call's output). Replay with graph.replay(); the output tensor is rewritten."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture (allocator, lazy init)
        with torch.cuda.graph(graph):
            out = fn()
    torch.cuda.current_stream().wait_stream(stream)
    return graph, out
