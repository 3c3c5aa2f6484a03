"""Programmatic dependent launch (b12x_core.pdl, csrc/launch.cuh): kernels launched with it start before the kernel
ahead of them ends and copy their first weights early, so the test is that nothing else moved. A chain in which every
call reads the previous call's output (PDL after PDL, and PDL after a plain torch kernel) gives the same bits with
B12X_PDL=1 as with B12X_PDL=0, eager and replayed in a CUDA graph on new inputs; so does the tensor-core MoE, whose
grouped GEMMs read a block table the routing kernel writes just before them. K splits are in every case (small N):
their tickets and partials are what a kernel started too early would corrupt.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from graphs import capture

import b12x_core as bc

pytest.importorskip("triton")

from test_moe_tiles import alone as moe_alone  # noqa: E402
from test_moe_tiles import problem  # noqa: E402
from test_tiles import alone as linear_alone  # noqa: E402
from test_tiles import make_weight  # noqa: E402

from b12x_core import workspace  # noqa: E402
from b12x_core.backends.cuda_gemv import CudaGemv  # noqa: E402
from b12x_core.backends.tensor_core import TensorCoreGemm  # noqa: E402
from b12x_core.backends.tensor_core_moe import TensorCoreMoE  # noqa: E402
from b12x_core.backends.tensor_core_wgmma import TensorCoreWgmma  # noqa: E402

pytestmark = pytest.mark.gpu

K = 1024  # square layers, so each output feeds the next call
STEPS = 6
CASES = [(TensorCoreGemm, "NVFP4"), (TensorCoreGemm, "IQ2_XS"), (TensorCoreWgmma, "FP8"), (TensorCoreWgmma, "NVFP4"),
         (TensorCoreWgmma, "IQ2_XS"), (CudaGemv, "FP8"), (CudaGemv, "Q8_0")]  # fmt: skip


def _args(monkeypatch, backend, weights, pdl: str, max_tokens: int):
    monkeypatch.setenv("B12X_PDL", pdl)  # read when the plan is built (warm-up makes the layouts)
    plans = [linear_alone(backend, qw, "bf16", "cuda", max_tokens)[0] for qw in weights]
    monkeypatch.delenv("B12X_PDL")
    return plans


def _chain(plans, x, m):
    """STEPS calls, each on the last one's output; every other step through a torch kernel in between."""
    outs, y = [], x
    for i in range(STEPS):
        y = plans[i % 2].for_tokens(m).run(y, None)
        outs.append(y)
        if i % 2:
            y = y * 0.5  # a plain (non-PDL) kernel ahead of the next call
    return outs


@pytest.mark.parametrize("m", [1, 24])
@pytest.mark.parametrize("backend,fmt", CASES, ids=[f"{b.name}-{f}" for b, f in CASES])
def test_a_dependent_chain_is_bit_identical_with_and_without_pdl(rng, monkeypatch, backend, fmt, m):
    x = torch.from_numpy(rng.standard_normal((m, K)).astype(np.float32)).to(torch.bfloat16).cuda()
    weights = [make_weight(rng, fmt, K, K, False, x.cpu()) for _ in range(2)]
    ok, why = backend.can_implement(bc.prepare_linear(weights[0], device="cuda", max_tokens=32).plan.query)
    if not ok:
        pytest.skip(f"{backend.name} cannot run here: {why}")
    plain = _args(monkeypatch, backend, weights, "0", 32)
    pdl = _args(monkeypatch, backend, weights, "1", 32)
    workspace.poison(torch.device("cuda"))
    expect = _chain(plain, x, m)
    workspace.poison(torch.device("cuda"))
    got = _chain(pdl, x, m)
    for i, (a, b) in enumerate(zip(got, expect, strict=True)):
        assert torch.equal(a, b), f"step {i}"

    graph, outs = capture(lambda: _chain(pdl, x, m))
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        for i, (a, b) in enumerate(zip(outs, _chain(plain, x, m), strict=True)):
            assert torch.equal(a, b), f"graph replay, step {i}"


def test_the_tensor_core_moe_is_bit_identical_with_and_without_pdl(rng, monkeypatch):
    t, e, top_k = 5, 8, 2
    x, w13, w2, weights, ids = problem(rng, "NVFP4", "bf16", "silu", e=e, h=512, inter=256, t=t, top_k=top_k)
    kw = dict(activation="silu", max_tokens=16, top_k=top_k, act_format="bf16")
    dispatched = bc.prepare_moe(w13, w2, device="cuda", **kw)
    ok, why = TensorCoreMoE.can_implement(dispatched.plan.query)
    if not ok:
        pytest.skip(f"tensor_core_moe cannot run here: {why}")
    x, weights, ids = x.cuda(), weights.cuda(), ids.cuda()
    outs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("B12X_PDL", flag)  # the expert layouts are made on the first call
        plan = moe_alone(dispatched, w13, w2, backend=TensorCoreMoE)
        row = plan.for_tokens(t)
        workspace.poison(torch.device("cuda"))
        outs[flag] = (plan, row.run(x, weights, ids))
        monkeypatch.delenv("B12X_PDL")
    assert torch.equal(outs["1"][1], outs["0"][1])

    pdl_row, plain_row = outs["1"][0].for_tokens(t), outs["0"][0].for_tokens(t)
    graph, y = capture(lambda: pdl_row.run(x, weights, ids))
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        ids.copy_(torch.randint(0, e, ids.shape, device="cuda", dtype=ids.dtype))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, plain_row.run(x, weights, ids))
