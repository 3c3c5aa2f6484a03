"""b12x ops on two CUDA streams at once (vLLM's shared-expert stream, overlapped micro-batches): each stream has
its own temporaries (workspace.py), so concurrent calls give the bits they give one after another.

The layers are chosen so that every call needs temporaries: an FP8 layer quantizes its activations per token
into the scratch, the tensor-core GEMM splits K at four tokens (float32 partials in the scratch and tickets),
the MoE holds its slot tables and intermediates there. Sharing one scratch, the streams would overwrite each
other's temporaries while both run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import b12x_core as bc
import b12x_formats as bf
from b12x_core import plan, workspace
from b12x_core.backends.tensor_core import TensorCoreGemm
from b12x_core.weights import DeviceWeights, as_shards

pytestmark = [pytest.mark.gpu, pytest.mark.fast]


def _weight(rng, fmt, *shape):
    return bf.quantize((rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32), fmt)


def test_two_streams_at_once_give_the_bits_of_one_after_another(rng):
    device = torch.device("cuda", torch.cuda.current_device())
    fp8 = bc.prepare_linear(_weight(rng, "FP8", 4096, 4096), device=device, max_tokens=256, activation="fp8")
    qw = _weight(rng, "NVFP4", 2048, 4096)
    dispatched = bc.prepare_linear(qw, device=device, max_tokens=16)
    split = plan.build(dispatched.plan.query, DeviceWeights(as_shards(qw), "bf16", None, device), only=TensorCoreGemm)
    assert split.for_tokens(4).config["splits"] > 1, split.for_tokens(4).config
    w13, w2 = _weight(rng, "MXFP4", 8, 1024, 1024), _weight(rng, "MXFP4", 8, 1024, 512)
    moe = bc.prepare_moe(w13, w2, device=device, max_tokens=64, top_k=2)

    x_fp8 = torch.randn(256, 4096, dtype=torch.bfloat16, device=device)
    x_split = torch.randn(4, 4096, dtype=torch.bfloat16, device=device)
    x_moe = torch.randn(64, 1024, dtype=torch.bfloat16, device=device)
    weights, ids = bc.route_topk(torch.randn(64, 8, device=device), 2)
    first = lambda: bc.linear(x_fp8, fp8)  # noqa: E731
    second = lambda: (split.for_tokens(4).run(x_split, None), bc.moe(x_moe, weights, ids, moe))  # noqa: E731
    expected = (first(), *second())  # one after another, on the current stream

    streams = torch.cuda.Stream(device), torch.cuda.Stream(device)
    for s in streams:
        s.wait_stream(torch.cuda.current_stream(device))
    got = []
    for _ in range(20):  # many launches queued on both before either finishes: their kernels overlap
        with torch.cuda.stream(streams[0]):
            a = first()
        with torch.cuda.stream(streams[1]):
            b, c = second()
        got.append((a, b, c))
    for s in streams:
        torch.cuda.current_stream(device).wait_stream(s)
    torch.cuda.synchronize(device)
    assert workspace.streams(device) >= 3  # the preparing stream's temporaries and one set per side stream
    for outputs in got:
        for y, want in zip(outputs, expected, strict=True):
            assert torch.equal(y, want)
