"""CUDA-graph capture for the GPU tests: warm up on a side stream, capture one call, hand back the graph; a linear
call replayed on new activations, an MoE call on new inputs and routing."""

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


def check_linear_replays_with_new_activations(run, x, bias=None, replays: int = 3) -> None:
    """Capture run(x, bias) once, then replay it on new activations: every replay's output equals an eager call's on
    the same inputs."""
    graph, out = capture(lambda: run(x, bias))
    for _ in range(replays):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, run(x, bias))


def check_moe_replays_with_new_routing(run, x, weights, ids, experts: int, replays: int = 3) -> None:
    """Capture run(x, weights, ids) once, then replay it on new activations and routing (ids drawn over `experts`):
    every replay's output equals an eager call's on the same inputs."""
    graph, out = capture(lambda: run(x, weights, ids))
    for _ in range(replays):
        ids.copy_(torch.randint(0, experts, ids.shape, device=ids.device, dtype=ids.dtype))
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, run(x, weights, ids))
