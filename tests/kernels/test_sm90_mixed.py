"""The Hopper mixed-input GEMM on CUTLASS's SM90 pieces (b12x_kernels.sm90_mixed_gemm, csrc/sm90_mixed_gemm.cuh;
the cutlass_sm90 backend).

On CPU: the block-scale carriers' relayout against a loop, Q8_0's split into codes and d's against gguf's decode; the
backend declines what it cannot run, with the reason (the checkpoint form: all but FP8); the binding refuses shapes
before any CUDA call. On an sm_90 GPU (marked gpu): FP8, NVFP4, MXFP4, MXFP8 and Q8_0 weights (all but FP8 in the
reordered layout only) of two fused shards with their own per-tensor factors, N a multiple of 64 but not of the
128-row tile, K a multiple of 64 but not of 128, M in {1, 7, 64, 300, 1024} (each with the plan's token tile), bias on
and off, every scheduler split (data-parallel, CUTLASS's heuristic, stream-K), outputs and scratch poisoned first,
against the b12x-core reference (closeness.py; Q8_0 within its one bf16 rounding of q·d); repeats bit-identical;
every token tile at a partial and a several-tile M; CUDA graph replay with new inputs (the stream-K barriers zeroed in
the graph)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from closeness import close, rounding_slack
from test_tiles import alone, make_weight

import b12x_core as bc
import b12x_formats as bf
from b12x_core import kernels, workspace
from b12x_core.backends import DeviceInfo, Query
from b12x_core.backends.cutlass_sm90 import CutlassSm90, CutlassSm90Checkpoint
from b12x_core.backends.sm90_layout import q8_0_split, tile_scales
from b12x_core.weights import as_shards, dequantize_rows
from b12x_formats.quantized import codec_for
from b12x_kernels import interface

FORMATS = list(interface.SM90_MIXED.formats)
FORMS = [CutlassSm90, CutlassSm90Checkpoint]  # the reordered layout, the checkpoint's
# What each form converts: the reordered layout every kind, the checkpoint's those with a kernel for it
FORM_FORMATS = {CutlassSm90: FORMATS, CutlassSm90Checkpoint: list(interface.SM90_MIXED_CHECKPOINT_FORMATS)}
PAIRS = [pytest.param(form, fmt, id=f"{form.name}-{fmt}") for form in FORMS for fmt in FORM_FORMATS[form]]
MS = [1, 7, 64, 300, 1024]
N, K = 320, 576  # two shards of 160 rows: neither a multiple of the 128-row tile; K: 9 k-tiles, not a multiple of 128


def _h100(capability=(9, 0), **facts) -> DeviceInfo:
    return DeviceInfo(torch.device("cuda", 0), capability, 132, 227, **facts)


def _query(fmt="FP8", act_mode="bf16", n=N, k=K, device=None) -> Query:
    return Query("linear", fmt, act_mode, act_mode, device or _h100(), n=n, k=k, max_tokens=64)


# ---------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("group", [16, 32])
def test_tile_scales_put_each_rows_tile_scales_together(rng, group):
    n, k = 192, 640
    block = torch.from_numpy(rng.integers(0, 256, (n, k // group), dtype=np.uint8))
    tiled = tile_scales(block, k)
    per_tile = 64 // group
    assert tiled.shape == (k // 64, n, per_tile) and tiled.is_contiguous()
    for t in range(k // 64):
        for row in range(0, n, 37):
            for i in range(per_tile):
                assert tiled[t, row, i] == block[row, t * per_tile + i]


def test_q8_0_split_gives_the_codes_and_ds_gguf_decodes(rng):
    """q · d of the split, in float32 (exact: 8 x 11 significant bits), is gguf's decode of the blocks exactly; the d's
    take the carrier's layout as block scales do."""
    n, k = 128, 320
    w = (rng.standard_normal((n, k)) * rng.uniform(1e-3, 10.0, (n, 1))).astype(np.float32)
    blocks = bf.quantize(w, "Q8_0").tensors["weight"]
    codes, deltas = q8_0_split(torch.from_numpy(np.ascontiguousarray(blocks)), n, k)
    assert codes.shape == (n, k) and codes.dtype == torch.uint8 and deltas.shape == (n, k // 32)
    decoded = codes.view(torch.int8).float() * deltas.float().repeat_interleave(32, dim=1)
    expected = torch.from_numpy(bf.dequantize(bf.QuantizedWeight.from_tensors("Q8_0", {"weight": blocks})))
    assert torch.equal(decoded, expected.float())
    tiled = tile_scales(deltas, k)
    assert tiled.shape == (k // 64, n, 2) and tiled.dtype == torch.float16 and tiled.is_contiguous()
    for t in range(k // 64):
        for row in range(0, n, 29):
            for i in range(2):
                assert tiled[t, row, i].view(torch.int16) == deltas[row, 2 * t + i].view(torch.int16)


def test_q8_0_split_refuses_other_bytes():
    with pytest.raises(ValueError, match=r"Q8_0 blocks: expected uint8 with N x K/32 x 34 = 64 x 2 x 34 bytes"):
        q8_0_split(torch.zeros(64, 2, 33, dtype=torch.uint8), 64, 64)


@pytest.mark.parametrize(
    "query,why",
    [
        (_query(fmt="IQ2_XS"), "converts FP8, NVFP4, MXFP4, MXFP8, Q8_0, not IQ2_XS"),
        (_query(act_mode="fp8_token"), "needs bf16-exact activations"),
        (_query(n=96), "needs N and K multiples of 64"),
        (_query(k=96), "needs N and K multiples of 64"),
        (_query(device=_h100((12, 0))), "needs compute capability 9.0"),
        (_query(device=_h100(sm90_mixed="this build of b12x-kernels holds none")), "holds none"),
        (_query(device=DeviceInfo.of(torch.device("cpu"))), "needs a CUDA device"),
    ],
)
@pytest.mark.parametrize("form", FORMS, ids=lambda c: c.name)
def test_backend_declines_with_the_reason(form, query, why):
    ok, reason = form.can_implement(query)
    assert not ok and why in reason


@pytest.mark.parametrize("fmt", ["NVFP4", "MXFP4", "MXFP8", "Q8_0"])
def test_checkpoint_form_declines_the_reordered_only_kinds(fmt):
    ok, reason = CutlassSm90Checkpoint.can_implement(_query(fmt=fmt))
    assert not ok and f"checkpoint layout of FP8 only, not {fmt}" in reason
    assert CutlassSm90.can_implement(_query(fmt=fmt))[0]


def test_plans_give_each_m_its_token_tile():
    """A decode-sized call takes the 16-token tile, a small batch 64, then 128, and prefill the 256-token tile (from
    fewer tokens for 4-bit codes, whose conversion costs more); every tile is one the kernels exist for."""
    for fmt, from_256 in (("NVFP4", 193), ("MXFP4", 193), ("MXFP8", 193), ("Q8_0", 193), ("FP8", 513)):
        rows = CutlassSm90.configs(_query(fmt=fmt, n=28672, k=4096), 1, 4096)
        assert [(lo, hi, c["tokens"]) for lo, hi, c in rows] == [(1, 16, 16), (17, 64, 64), (65, from_256 - 1, 128),
                                                                 (from_256, 4096, 256)]  # fmt: skip
        assert {c["tokens"] for _, _, c in rows} == set(interface.SM90_MIXED.token_tiles)


def test_a_small_n_keeps_128_token_tiles_while_256_would_not_fill_half_the_sms():
    """The 8B o (N = K = 4096) on 132 SMs: 256-token tiles from 513 tokens (64 of them there), 128 before; a long K
    (the down's 14336) takes 256 from 193 whatever N."""
    rows = CutlassSm90.configs(_query(fmt="NVFP4", n=4096, k=4096), 65, 4096)
    assert [(lo, hi, c["tokens"]) for lo, hi, c in rows] == [(65, 512, 128), (513, 4096, 256)]
    rows = CutlassSm90.configs(_query(fmt="NVFP4", n=4096, k=14336), 65, 4096)
    assert [(lo, hi, c["tokens"]) for lo, hi, c in rows] == [(65, 192, 128), (193, 4096, 256)]


@pytest.mark.parametrize("form", FORMS, ids=lambda c: c.name)
def test_backend_takes_what_it_converts(form):
    for fmt in FORM_FORMATS[form]:
        for act_mode in interface.SM90_MIXED.act_modes:
            ok, reason = form.can_implement(_query(fmt=fmt, act_mode=act_mode))
            assert ok, (fmt, act_mode, reason)


@pytest.mark.skipif(not kernels.sm90_mixed_built(), reason="the extension holds no sm_90a CUTLASS kernels")
@pytest.mark.parametrize(
    "shape,why",
    [
        (dict(weight=7), "unknown weight kind"),
        *[
            (dict(weight=interface.SM90_MIXED_WEIGHTS[fmt], reordered=False), "reordered layout only")
            for fmt in ("NVFP4", "MXFP4", "MXFP8", "Q8_0")
        ],
        (dict(m=0), "m >= 1"),
        (dict(n=96), "N a positive multiple of 64"),
        (dict(k=32), "K a positive multiple of 64"),
        (dict(decomposition=3), "unknown decomposition"),
        (dict(sms=0), "sms >= 1"),
        (dict(tokens=32), "no kernel for that token tile"),
    ],
)
def test_binding_refuses_bad_shapes_before_cuda(shape, why):
    args = dict(weight=1, reordered=True, m=8, n=128, k=128, decomposition=1, sms=132) | shape
    with pytest.raises(ValueError, match=why):
        kernels.sm90_mixed_workspace_bytes(**args)


@pytest.mark.skipif(not kernels.sm90_mixed_built(), reason="the extension holds no sm_90a CUTLASS kernels")
def test_kernels_are_sm90a_only_and_keep_their_values_in_registers():
    """One CUTLASS kernel per weight kind, layout it has a kernel for and token tile, in the sm_90a code only, none
    with a stack frame or local memory (a spill, or a device assert left in: a call inside the mainloop also
    serializes its wgmmas)."""
    from test_build import cuobjdump

    arch, current, kernels_seen = "", None, {}
    for line in cuobjdump("-res-usage").splitlines():
        if line.startswith("arch = "):
            arch = line.split()[-1]
        elif line.strip().startswith("Function "):
            current = line.strip() if "GemmUniversal" in line else None
            if current:
                kernels_seen[current] = arch
        elif "REG:" in line and current:
            usage = dict(field.split(":") for field in line.split())
            assert usage["STACK"] == "0" and usage["LOCAL"] == "0", f"{arch} {current[:120]} {line.strip()}"
    # the linear kernels: the grouped MoE's (sm90_moe_gemm.cuh) are GemmUniversal too, over a GroupProblemShape
    linear = [name for name in kernels_seen if "GroupProblemShape" not in name]
    expected = sum(len(kinds) for kinds in FORM_FORMATS.values()) * len(interface.SM90_MIXED.token_tiles)
    assert len(linear) == expected, linear
    assert set(kernels_seen.values()) == {"sm_90a"}, kernels_seen


# ---------------------------------------------------------------------------------------------- GPU


def _sm90_here() -> DeviceInfo:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    device = DeviceInfo.of(torch.device("cuda", 0))
    ok, why = CutlassSm90.can_implement(_query(device=device))
    if not ok:
        pytest.skip(f"cutlass_sm90 cannot run here: {why}")
    return device


def _activations(fmt: str) -> list[tuple[str, bool]]:
    """(activation, with an input_scale): bf16, and the format's quantized mode that bf16 holds exactly (Q8_0 has
    none)."""
    quantized = {"NVFP4": [("nvfp4", True)], "MXFP4": [("mxfp8", False)], "FP8": [("fp8", True)],
                 "MXFP8": [("mxfp8", False)], "Q8_0": []}  # fmt: skip
    return [("bf16", False)] + quantized[fmt]


def _takes_input_scale(fmt: str) -> bool:
    return "input_scale" in codec_for(fmt).per_tensor_names()


def _slack(fmt: str, x: torch.Tensor, shards) -> torch.Tensor | float:
    """What the kernel's one bf16 rounding of each Q8_0 weight (q · d) can move each output (0 for the exact kinds)."""
    return rounding_slack(fmt, x, dequantize_rows(as_shards(shards), "cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("decomposition", interface.SM90_MIXED_DECOMPOSITIONS)
@pytest.mark.parametrize("form,fmt", PAIRS)
def test_matches_the_reference(rng, form, fmt, decomposition):
    _sm90_here()
    x = torch.from_numpy(rng.standard_normal((max(MS), K)).astype(np.float32)).to(torch.bfloat16)
    for activation, scaled in _activations(fmt):
        shards = make_weight(rng, fmt, N // 2, K, scaled, x, shards=2)
        gpu, ref = alone(form, shards, activation, "cuda", max(MS))
        bias = torch.from_numpy(rng.standard_normal(N).astype(np.float32)).to(torch.bfloat16)
        for m in MS:
            row = gpu.for_tokens(m)
            config = row.config | {"decomposition": decomposition}
            for b in (bias, None):
                workspace.poison(torch.device("cuda"))  # the scheduler's scratch and operands: written before read
                y = row.backend.run(x[:m].cuda(), None if b is None else b.cuda(), config=config)
                assert y.shape == (m, N)
                close(y, bc.linear(x[:m], ref, b), _slack(fmt, x[:m], shards))
                again = row.backend.run(x[:m].cuda(), None if b is None else b.cuda(), config=config)
                assert torch.equal(again, y), (fmt, activation, m)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", interface.SM90_MIXED.token_tiles)
@pytest.mark.parametrize("form,fmt", PAIRS)
def test_every_token_tile_matches_the_reference(rng, form, fmt, tokens):
    """Each tile's kernel whatever M the plan gives it: one partial tile (7 tokens) and several with a partial last
    one (300), under stream-K, which splits the fewest tiles finest."""
    _sm90_here()
    m_most = 300
    x = torch.from_numpy(rng.standard_normal((m_most, K)).astype(np.float32)).to(torch.bfloat16)
    shards = make_weight(rng, fmt, N // 2, K, _takes_input_scale(fmt), x, shards=2)
    gpu, ref = alone(form, shards, "bf16", "cuda", m_most)
    bias = torch.from_numpy(rng.standard_normal(N).astype(np.float32)).to(torch.bfloat16).cuda()
    for m in (7, m_most):
        row = gpu.for_tokens(m)
        config = row.config | {"decomposition": "stream_k", "tokens": tokens}
        # the plan reserved scratch for its own tile; this one's stream-K partials may need more
        workspace.reserve_scratch(torch.device("cuda"), row.backend.scratch_bytes(m, config))
        workspace.poison(torch.device("cuda"))
        y = row.backend.run(x[:m].cuda(), bias, config=config)
        close(y, bc.linear(x[:m], ref, bias.cpu()), _slack(fmt, x[:m], shards))


@pytest.mark.gpu
@pytest.mark.parametrize("form,fmt", PAIRS)
def test_graph_replay_with_new_inputs(rng, form, fmt):
    _sm90_here()
    m = 300
    xs = [torch.from_numpy(rng.standard_normal((m, K)).astype(np.float32)).to(torch.bfloat16) for _ in range(2)]
    shards = make_weight(rng, fmt, N // 2, K, False, xs[0], shards=2)
    gpu, ref = alone(form, shards, "bf16", "cuda", m)
    row = gpu.for_tokens(m)
    config = row.config | {"decomposition": "stream_k"}  # the split whose barriers must be zeroed each replay
    static_x = xs[0].cuda()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        row.backend.run(static_x, None, config=config)  # warm: the kernel's attributes, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static_y = row.backend.run(static_x, None, config=config)
    for x in xs:
        static_x.copy_(x.cuda())
        static_y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        close(static_y, bc.linear(x, ref), _slack(fmt, x, shards))
