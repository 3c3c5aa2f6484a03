"""The decode-sized GEMM on the Hopper CUTLASS family's reordered weight layout (b12x_kernels.fragment_mma_gemm,
csrc/fragment_mma.cu; the fragment_mma backend).

On CPU: the token tile and K split rules; the backend declines what it cannot run, with the reason, and takes NVFP4
and MXFP4 with every bf16-exact mode; the binding refuses bad arguments before any CUDA call. On an sm_90 GPU (marked
gpu): NVFP4 and MXFP4 weights of two fused shards with their own per-tensor factors (N a multiple of 64, not of 128;
K 9 k-tiles), bf16 and the format's quantized activation mode, M across every token tile's edges and past the largest
(several passes), bias on and off, K split into 1, 2, 4 and 9 (one k-tile a CTA, steps not filled), a row block with its upper half past N, outputs and scratch
poisoned first, against the b12x-core reference (closeness.py); repeats bit-identical; CUDA graph replay of a split
call (the tickets reset by the kernel) with new inputs; one copy of the weight shared with cutlass_sm90."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from closeness import close
from test_tiles import alone, make_weight

import b12x_core as bc
from b12x_core import kernels, plan, workspace
from b12x_core.backends import DeviceInfo, Query
from b12x_core.backends.cutlass_sm90 import CutlassSm90
from b12x_core.backends.fragment_mma import FragmentMma, k_splits, token_tile
from b12x_core.weights import DeviceWeights, as_shards
from b12x_kernels import interface

FORMATS = list(interface.FRAGMENT_MMA.formats)
N, K = 320, 576  # two shards of 160 rows; K: 9 k-tiles
MS = [1, 3, 4, 5, 8, 9, 16, 17, 32, 33, 70]


def _h100(capability=(9, 0), **facts) -> DeviceInfo:
    return DeviceInfo(torch.device("cuda", 0), capability, 132, 227, **facts)


def _query(fmt="NVFP4", act_mode="bf16", n=N, k=K, device=None) -> Query:
    return Query("linear", fmt, act_mode, act_mode, device or _h100(), n=n, k=k, max_tokens=64)


# ---------------------------------------------------------------------------------------------- CPU


def test_token_tile_is_the_smallest_that_holds_m():
    assert [token_tile(m) for m in (1, 4, 5, 8, 9, 16, 17, 32, 33, 4096)] == [4, 4, 8, 8, 16, 16, 32, 32, 32, 32]
    assert {token_tile(m) for m in range(1, 100)} == set(interface.FRAGMENT_MMA.token_tiles)


def test_k_split_fills_the_sms_with_even_steps():
    # 1-4 tokens (16-row CTAs, warps splitting K): no split while the row groups cover the SMs
    assert k_splits(4096, 4096, 1, 132) == 1 and k_splits(28672, 4096, 4, 132) == 1
    assert k_splits(64, 1024, 1, 132) == 2  # 4 row groups: as far as one k-tile a warp
    # 128-row CTAs: the largest power of two within 3 CTAs an SM that divides the 4-k-tile steps
    assert k_splits(4096, 4096, 8, 132) == 8  # o: 32 row blocks
    assert k_splits(6144, 4096, 16, 132) == 8  # qkv: 48
    assert k_splits(28672, 4096, 32, 132) == 1  # gate_up: 224
    assert k_splits(4096, 14336, 8, 132) == 8  # down: 56 steps
    assert k_splits(4096, 4096, 64, 132) == 4  # two passes of 32 tokens
    assert k_splits(4096, 192, 8, 132) == 1  # no whole step


@pytest.mark.parametrize(
    "query,why",
    [
        (_query(fmt="FP8"), "decodes NVFP4, MXFP4, not FP8"),
        (_query(act_mode="fp8_token"), "needs bf16-exact activations"),
        (_query(n=96), "needs N and K multiples of 64"),
        (_query(k=96), "needs N and K multiples of 64"),
        (_query(device=_h100((12, 0))), "needs compute capability 9.0"),
        (_query(device=_h100(sm90_mixed="this build of b12x-kernels holds none")), "holds none"),
        (_query(device=DeviceInfo.of(torch.device("cpu"))), "needs a CUDA device"),
    ],
)
def test_backend_declines_with_the_reason(query, why):
    ok, reason = FragmentMma.can_implement(query)
    assert not ok and why in reason


def test_backend_takes_what_it_decodes_and_reads_the_cutlass_copy():
    for fmt in FORMATS:
        for act_mode in interface.FRAGMENT_MMA.act_modes:
            ok, reason = FragmentMma.can_implement(_query(fmt=fmt, act_mode=act_mode))
            assert ok, (fmt, act_mode, reason)
    assert FragmentMma.reads == CutlassSm90.reads


def test_plan_rows_name_a_tile_and_a_split_the_kernel_has():
    q = _query(n=4096, k=4096)
    rows = FragmentMma.configs(q, 1, 64)
    assert rows[0][0] == 1 and rows[-1][1] == 64 and {c["tokens"] for _, _, c in rows} == {4, 8, 16, 32}
    assert all(a[1] + 1 == b[0] for a, b in zip(rows, rows[1:], strict=False))  # consecutive ranges
    for lo, hi, c in rows:
        assert {token_tile(m) for m in (lo, hi)} == {c["tokens"]}
        assert {k_splits(q.n, q.k, m, q.device.sms) for m in (lo, hi)} == {c["splits"]}
        assert c["tokens"] in interface.FRAGMENT_MMA.token_tiles and 1 <= c["splits"] <= q.k // 64


@pytest.mark.skipif(not kernels.built(), reason="the CUDA extension is not built")
@pytest.mark.parametrize(
    "change,why",
    [
        (dict(weight=0), "decodes NVFP4 and MXFP4 only"),
        (dict(m=0), "m >= 1"),
        (dict(n=96), "N a positive multiple of 64"),
        (dict(k=32), "K a positive multiple of 64"),
        (dict(tokens=64), "no kernel for that token tile"),
        (dict(tokens=4, splits=2, partial_floats=1), "fewer partials or tickets"),
        (dict(splits=3), "1 <= splits <= K / 64"),
        (dict(w=0), "null weight"),
        (dict(splits=2, partials=0), "needs its partials and tickets"),
        (dict(x=264), "16-byte alignment"),
        (dict(scale_mul=0.0), "scale_mul and alpha_shift > 0"),
        (dict(splits=2, partial_floats=1), "fewer partials or tickets"),
    ],
)
def test_binding_refuses_bad_arguments_before_cuda(change, why):
    # fake but aligned addresses: every rule is checked before the launch reads anything
    args = dict(weight=1, m=8, n=128, k=128, w=256, scales=256, x=256, y=256, alpha=256, bias=0, scale_mul=1.0,
                alpha_shift=1.0, tokens=8, splits=1, partials=256, partial_floats=1 << 20, tickets=256,
                ticket_count=1 << 10, stream=0) | change  # fmt: skip
    with pytest.raises(ValueError, match=why):
        kernels.fragment_mma_gemm(**args)


# ---------------------------------------------------------------------------------------------- GPU


def _sm90_here() -> DeviceInfo:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    device = DeviceInfo.of(torch.device("cuda", 0))
    ok, why = FragmentMma.can_implement(_query(device=device))
    if not ok:
        pytest.skip(f"fragment_mma cannot run here: {why}")
    return device


def _activations(fmt: str) -> list[tuple[str, bool]]:
    """(activation, with an input_scale): bf16, and the format's quantized mode bf16 holds exactly."""
    return [("bf16", False), ("nvfp4", True) if fmt == "NVFP4" else ("mxfp8", False)]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_the_reference(rng, fmt):
    _sm90_here()
    x = torch.from_numpy(rng.standard_normal((max(MS), K)).astype(np.float32)).to(torch.bfloat16)
    bias = torch.from_numpy(rng.standard_normal(N).astype(np.float32)).to(torch.bfloat16)
    for activation, scaled in _activations(fmt):
        shards = make_weight(rng, fmt, N // 2, K, scaled, x, shards=2)
        gpu, ref = alone(FragmentMma, shards, activation, "cuda", max(MS))
        for m in MS:
            row = gpu.for_tokens(m)
            for splits in (1, 2, 4, K // 64):
                config = row.config | {"splits": splits}
                workspace.reserve_scratch(torch.device("cuda"), row.backend.scratch_bytes(m, config))
                workspace.reserve_tickets(torch.device("cuda"), row.backend.tickets_of(m, config))
                row.backend.tickets_needed = max(row.backend.tickets_needed, row.backend.tickets_of(m, config))
                for b in (bias, None):
                    workspace.poison(torch.device("cuda"))  # partials and operands: written before read
                    y = row.backend.run(x[:m].cuda(), None if b is None else b.cuda(), config=config)
                    assert y.shape == (m, N)
                    close(y, bc.linear(x[:m], ref, b))
                    again = row.backend.run(x[:m].cuda(), None if b is None else b.cuda(), config=config)
                    assert torch.equal(again, y), (fmt, activation, m, splits)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 5])  # each form: 16-row CTAs, 128-row CTAs
@pytest.mark.parametrize("fmt", FORMATS)
def test_graph_replay_of_a_split_call_with_new_inputs(rng, fmt, m):
    _sm90_here()
    xs = [torch.from_numpy(rng.standard_normal((m, K)).astype(np.float32)).to(torch.bfloat16) for _ in range(3)]
    shards = make_weight(rng, fmt, N // 2, K, False, xs[0], shards=2)
    gpu, ref = alone(FragmentMma, shards, "bf16", "cuda", m)
    row = gpu.for_tokens(m)
    config = row.config | {"splits": 3}  # every replay takes and resets the row groups' tickets
    workspace.reserve_scratch(torch.device("cuda"), row.backend.scratch_bytes(m, config))
    row.backend.tickets_needed = row.backend.tickets_of(m, config)
    workspace.reserve_tickets(torch.device("cuda"), row.backend.tickets_needed)
    static_x = xs[0].cuda()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        row.backend.run(static_x, None, config=config)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static_y = row.backend.run(static_x, None, config=config)
    for x in xs:
        static_x.copy_(x.cuda())
        static_y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        close(static_y, bc.linear(x, ref))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_shares_one_copy_with_cutlass_sm90(rng, fmt):
    """A plan of both reads one "sm90" layout: both backends hold the same codes, and each matches the reference."""
    _sm90_here()
    x = torch.from_numpy(rng.standard_normal((300, K)).astype(np.float32)).to(torch.bfloat16)
    shards = make_weight(rng, fmt, N // 2, K, False, x, shards=2)
    lin = bc.prepare_linear(shards, device="cuda", max_tokens=300)
    ref = bc.prepare_linear(shards, max_tokens=300)
    weights = DeviceWeights(as_shards(shards), lin.act_mode, lin.input_scale, lin.device)
    small = plan.build(lin.plan.query, weights, only=FragmentMma)
    large = plan.build(lin.plan.query, weights, only=CutlassSm90)
    a, b = small.for_tokens(4).backend, large.for_tokens(300).backend
    assert a.layout is b.layout
    for m, row in ((4, small.for_tokens(4)), (300, large.for_tokens(300))):
        workspace.poison(torch.device("cuda"))
        close(row.backend.run(x[:m].cuda(), None, config=row.config), bc.linear(x[:m], ref))
