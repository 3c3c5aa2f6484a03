"""The Hopper form of the tensor-core GEMM (b12x_kernels.wgmma_gemm, csrc/wgmma_gemm.cu; b12x_core.tensor_core.wgmma
and the tensor_core_wgmma backend).

On CPU: the binding refuses argument blocks and calls it cannot run before any CUDA call; the backend declines what it
cannot run, with the reason. The grouped form (a fused MoE's GEMMs over a block table; tensor_core_moe_wgmma) is held to
the mma.sync kernel's grouped form. On an sm_90 GPU (marked gpu): every format it runs, random weights, M ∈ {1, 7, 37,
129, 200} under every token tile, K whole and split, N with a tail (a partial row tile, a partial CTA, a dead
warpgroup), K over several chunks plus a tail chunk, bias on and off, outputs poisoned with NaN first, against the
b12x-core reference (closeness.py) and the mma.sync kernel's result over the same repacked weights; the MoE epilogues
(silu, relu2) equal to the mma.sync kernel's; repeats bit-identical; CUDA graph replay with new inputs (split-K tickets
reset); the 256-row CTAs (tiles 16, FP4: the plans' FP4 form from wgmma.WIDE_FROM tokens) under the same checks.
"""

from __future__ import annotations

import math

import fake_args
import numpy as np
import pytest
import torch
from closeness import close
from fake_args import FAKE

import b12x_core as bc
import b12x_formats as bf
from b12x_formats.kernel_facts import format_id

FORMATS = ["FP8", "MXFP8", "NVFP4", "MXFP4", "Q8_0"]
FACTOR_FORMATS = ["FP8_BLOCK", "IQ2_XS", "IQ2_XXS"]  # a per-chunk fp32 factor folded from partial sums
FACTOR_MTS = [1, 2, 4, 8]
MS = [1, 7, 37, 129, 200]
MTS = [1, 2, 4, 8, 16]


# ---------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize(
    "fields,call,why",
    [
        (dict(format=format_id("FP8_BLOCK"), chunks=2), {}, "FP8_BLOCK needs its block scales"),
        (dict(format=format_id("IQ2_XS")), {}, "IQ2_XS needs its sub-block scales"),
        (dict(format=format_id("IQ2_XXS")), {}, "IQ2 needs its grid tables"),
        (dict(format=format_id("IQ2_XS"), mt=16, meta2=16, tables=16), {}, "FP8_BLOCK and IQ2 run mt 1, 2, 4 or 8"),
        (
            dict(format=format_id("FP8_BLOCK"), chunks=2, block_scale=16, mt=4),
            dict(order=16, table=16, blocks=1),
            "grouped form runs no FP8_BLOCK",
        ),
        (dict(format=99), {}, "format must be"),
        (dict(mt=3), {}, "mt must be"),
        (dict(mt=32), {}, "mt must be"),
        (dict(rt=3), {}, "rt must be 1"),
        (dict(rt=2), {}, "rt must be 1"),
        (dict(splits=0), {}, "splits must be"),
        (dict(splits=2), {}, "splits must be"),  # one chunk
        (dict(K=100), {}, "K % 8"),
        (dict(chunks=0), {}, "fewer than K columns"),
        (dict(K=256), {}, "fewer than K columns"),  # one NVFP4 chunk holds 128
        (dict(codes=8), {}, "misaligned codes"),
        (dict(codes=0), {}, "misaligned codes"),
        (dict(meta=0), {}, "block scales"),
        (dict(ldy=16), {}, "ldy >= N"),
        (dict(epilogue=9), {}, "unknown epilogue"),
        ({}, dict(M=0), "M >= 1"),
        ({}, dict(x=8), "misaligned x"),
        ({}, dict(y=0), "misaligned x / y"),
        ({}, dict(staged=0), "staged scratch"),
        ({}, dict(order=16), "grouped needs the block table"),
        (dict(mt=2), dict(order=16, table=16, blocks=1), "grouped form runs mt 4, 8 or 16"),
        (dict(tiles=12), {}, "tiles must be 8, or 16"),
        (dict(tiles=16, mt=4), {}, "tiles must be 8, or 16"),
        (dict(tiles=16, mt=8, format=format_id("FP8"), chunks=2), {}, "tiles must be 8, or 16"),
        (dict(tiles=16, mt=8), dict(order=16, table=16, blocks=1), "grouped form runs 128-row CTAs"),
        (dict(resident=1), {}, "resident activations are mma_gemm's"),
        (dict(x_quant=1, x_quant_scale=1.0), {}, "quantized in the kernel are mma_gemm's"),
        ("short", {}, "interface.h differ"),
    ],
)
def test_kernel_entry_refuses_what_it_cannot_run_before_launching(fields, call, why):
    """The extension's checks run before any CUDA call, so they hold on a machine without a GPU too."""
    import b12x_kernels

    if b12x_kernels._C is None:
        pytest.skip(b12x_kernels.unavailable_reason())
    packed = b"\0" * 8 if fields == "short" else fake_args.mma_args(**fields)
    args = dict(x=FAKE, bias=0, y=FAKE, M=1, partials=0, tickets=0, staged=FAKE, stream=0)
    with pytest.raises(ValueError, match=why):
        b12x_kernels.wgmma_gemm(packed, **{**args, **call})


def test_token_tiles_and_staging_sizes():
    from b12x_core.tensor_core import geometry, wgmma

    ms = range(1, 4097)
    for fmt in FORMATS + FACTOR_FORMATS:  # a tile the format runs, never narrower for more tokens, one up to 16
        tiles = [wgmma.token_tile(m, fmt) for m in ms]
        assert set(tiles) <= set(FACTOR_MTS if fmt in FACTOR_FORMATS else MTS) and tiles == sorted(tiles)
        assert all(8 * mt >= m for m, mt in zip(ms, tiles, strict=True) if m <= 16)
    assert wgmma.FORMATS == tuple(FORMATS) and wgmma.TOKEN_TILES == tuple(MTS)
    assert wgmma.FACTOR_FORMATS == tuple(FACTOR_FORMATS) and wgmma.FACTOR_TOKEN_TILES == tuple(FACTOR_MTS)
    for mt in wgmma.WIDE_TOKEN_TILES:  # 256-row CTAs, one an SM: 16 row blocks of 4096 rows at 64 tokens, K split
        config = wgmma.wide_config(64, 4096, 64, 132, mt)
        assert config.tiles == 16 and config.rt == 1 and config.mt == mt and 1 < config.splits <= 16
    with pytest.raises(ValueError, match="token tile"):
        wgmma.wide_config(64, 4096, 64, 132, 4)
    for fmt in FORMATS + FACTOR_FORMATS:  # the plans' pick: 256-row CTAs for the FP4 formats at large M only
        for m in (1, 16, 256, 4096):
            config = wgmma.default_config(m, 4096, 32, lambda mt: 132, fmt=fmt, sms=132)
            wide = fmt in wgmma.WIDE_FORMATS and m >= wgmma.WIDE_FROM
            assert (config.tiles == wgmma.WIDE_TILES) == wide and (not wide or config.mt in wgmma.WIDE_TOKEN_TILES)
            assert wgmma.default_config(m, 4096, 32, lambda mt: 132, fmt=fmt).tiles == 8  # the GPU's size unknown
    for fmt in FORMATS:
        ck = geometry.chunk_k(fmt)
        # whole groups of 8 tokens × K padded to whole chunks, bf16
        assert wgmma.staged_bytes(fmt, 9, ck + 8) == 16 * 2 * ck * 2


def test_backend_declines_what_it_cannot_run():
    from b12x_core.backends import DeviceInfo, Query
    from b12x_core.backends.tensor_core_wgmma import TensorCoreWgmma
    from b12x_core.tensor_core import geometry

    def query(fmt="NVFP4", mode="bf16", capability=(9, 0), k=4096):
        device = DeviceInfo(torch.device("cuda", 0), capability, sms=132, smem_kb=227)
        return Query("linear", fmt, mode, mode, device, "auto", 4096, k, 64, (4096,))

    for fmt in FORMATS + FACTOR_FORMATS:
        assert TensorCoreWgmma.can_implement(query(fmt))[0], fmt
    for q, why in [
        (query(fmt="W4A16_MXFP4"), "not W4A16_MXFP4"),
        (query(capability=(12, 0)), "needs compute capability 9.0, this is sm_120"),
        (query(mode="fp8_token"), "bf16-exact activations"),
        (query(k=4100), "K % 8"),
    ]:
        ok, reason = TensorCoreWgmma.can_implement(q)
        assert not ok and why in reason, reason
    # its configurations cover every token count with a tile of at most 128 tokens (64 for the formats with a
    # per-chunk factor) and a K split that fits K
    for fmt, mts in (("NVFP4", MTS), ("IQ2_XS", FACTOR_MTS)):
        rows = TensorCoreWgmma.configs(query(fmt), 1, 4096)
        chunks = 4096 // geometry.chunk_k(fmt)
        assert rows[0][0] == 1 and rows[-1][1] == 4096
        assert all(c["tokens"] in {8 * mt for mt in mts} and 1 <= c["splits"] <= chunks for _, _, c in rows), fmt


# ---------------------------------------------------------------------------------------------- GPU


def _shapes(fmt):
    from b12x_core.tensor_core import geometry

    km = math.lcm(bf.spec(fmt).k_multiple, 8)
    ck = geometry.chunk_k(fmt)
    # N: one partial tile; 200 = one full CTA + 72 rows (warpgroup 1 partly dead, a half tile); 424 = 3 CTAs + 40.
    return [(16, km), (200, 3 * ck + km), (424, 7 * ck)]


def _case(rng, fmt, n, k):
    from b12x_core.tensor_core import gemm

    qw = bf.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt)
    return qw, gemm.prepare([qw], "cuda")


def _run(x, shards, n, bias, config, epilogue="bf16", wgmma_form=True):
    """One call of either form on the same shards and argument block fields; y poisoned first."""
    from b12x_core.tensor_core import gemm, wgmma

    m, k = x.shape
    cols = n // 2 if epilogue == "silu" else n
    y = torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
    ws = gemm.MmaWorkspace.create(m, n, config.splits, config.mt, "cuda")
    stream = torch.cuda.current_stream().cuda_stream
    if epilogue == "bf16":
        run = wgmma.run if wgmma_form else gemm.run
        extra = (torch.empty(wgmma.staged_bytes(shards[0].format, m, k), dtype=torch.uint8, device="cuda"),)
        run(x, shards, y, bias, config, ws, *(extra if wgmma_form else ()), stream)
        return y
    import b12x_kernels

    (s,) = shards
    args = s.args(config, cols, epilogue)
    if wgmma_form:
        staged = torch.empty(wgmma.staged_bytes(s.format, m, k), dtype=torch.uint8, device="cuda")
        b12x_kernels.wgmma_gemm(args, x.data_ptr(), 0, y.data_ptr(), m, ws.partials.data_ptr(),
                                ws.tickets.data_ptr(), staged.data_ptr(), stream)  # fmt: skip
    else:
        gemm.launch(args, x, y, m, ws, stream)
    return y


def _held_to_the_reference_and_the_mma_kernel(rng, fmt, ms, configs_of):
    """For every shape of _shapes(fmt), M in `ms`, bias on and off: each wgmma configuration of configs_of(chunks)
    equals the reference and the mma.sync kernel (itself held to the reference) on the same repacked weights."""
    from b12x_core.tensor_core import configure, gemm

    for n, k in _shapes(fmt):
        qw, shards = _case(rng, fmt, n, k)
        cpu = bc.prepare_linear(qw, max_tokens=max(ms))
        bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)
        configs = configs_of(shards[0].chunks)
        for m in ms:
            x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
            xg = x.cuda()
            for b in (None, bias):
                ref = bc.linear(x, cpu, b)
                bg = None if b is None else b.cuda()
                mma = _run(xg, shards, n, bg, gemm.MmaConfig(configure.token_tile(m), 1), wgmma_form=False)
                close(mma, ref)
                for config in configs:
                    y = _run(xg, shards, n, bg, config)
                    torch.cuda.synchronize()
                    close(y, ref)
                    close(y, mma)  # the same weights through the same decode: only the summation order differs


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_the_reference_and_the_mma_kernel(rng, hopper, fmt):
    from b12x_core.tensor_core import gemm

    def configs_of(chunks):
        return [gemm.MmaConfig(mt, splits) for mt in MTS for splits in sorted({1, min(3, chunks)})]

    _held_to_the_reference_and_the_mma_kernel(rng, fmt, MS, configs_of)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FACTOR_FORMATS)
def test_factor_formats_match_the_reference_and_the_mma_kernel(rng, hopper, fmt):
    """FP8_BLOCK's block scale and IQ2's d per chunk fold each chunk's partial sums into the accumulators (the
    backend lists these formats because this passed on the H200). IQ2 goes in units of
    four (two at 64-token tiles) k16 steps a chunk, so its chunks cross the A register sets' alternation within a
    chunk."""
    from b12x_core.tensor_core import gemm

    def configs_of(chunks):
        return [gemm.MmaConfig(mt, splits) for mt in FACTOR_MTS for splits in sorted({1, min(3, chunks)})]

    _held_to_the_reference_and_the_mma_kernel(rng, fmt, [1, 37, 129], configs_of)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["NVFP4", "MXFP4"])
def test_256_row_ctas_match_the_reference_and_the_mma_kernel(rng, hopper, fmt):
    """tiles = 16: four warpgroups a CTA, each decode group's wgmmas a group of their own (csrc/wgmma_gemm.cu). N as
    above: one CTA of 15 dead warps (N = 16), one with a dead warpgroup and a partial tile (200), a second CTA partly
    dead (424); M over partial and several token tiles; K whole and split."""
    from b12x_core.tensor_core import gemm, wgmma

    def configs_of(chunks):
        return [gemm.MmaConfig(mt, splits, tiles=wgmma.WIDE_TILES) for mt in wgmma.WIDE_TOKEN_TILES
                for splits in sorted({1, min(3, chunks)})]  # fmt: skip

    _held_to_the_reference_and_the_mma_kernel(rng, fmt, [1, 37, 129, 200], configs_of)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["NVFP4", "MXFP4"])
def test_plans_run_256_row_ctas_from_wide_from_tokens(rng, hopper, fmt):
    """A plan of the wgmma backend alone gives its FP4 calls of WIDE_FROM tokens and more 256-row CTAs (the
    backend's own scratch and tickets), and they match the reference; below, 128-row ones."""
    from b12x_core import plan
    from b12x_core.backends import DeviceInfo, Query
    from b12x_core.backends.tensor_core_wgmma import TensorCoreWgmma
    from b12x_core.tensor_core import wgmma
    from b12x_core.weights import DeviceWeights

    n, k, m = 424, 7 * 128, wgmma.WIDE_FROM + 3
    qw = bf.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt)
    device = DeviceInfo.of(torch.device("cuda"))
    q = Query("linear", fmt, "bf16", "bf16", device, n=n, k=k, max_tokens=m)
    p = plan.build(q, DeviceWeights([qw], "bf16", None, device.device), only=TensorCoreWgmma)
    assert p.for_tokens(m).config.get("rows") == 256 and "rows" not in p.for_tokens(wgmma.WIDE_FROM - 1).config
    cpu = bc.prepare_linear(qw, max_tokens=m)
    for tokens in (m, wgmma.WIDE_FROM - 1):
        x = torch.from_numpy(rng.standard_normal((tokens, k)).astype(np.float32)).to(torch.bfloat16)
        close(p.for_tokens(tokens).run(x.cuda(), None).cpu(), bc.linear(x, cpu))


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", ["silu", "relu2"])
def test_moe_epilogues_equal_the_mma_kernels(rng, hopper, epilogue):
    from b12x_core.tensor_core import gemm

    n, k = 256, 512
    qw, shards = _case(rng, "MXFP4", n, k)
    x = torch.randn(37, k, device="cuda").to(torch.bfloat16)
    for config in (gemm.MmaConfig(4, 1), gemm.MmaConfig(8, 2), gemm.MmaConfig(16, 1)):
        mma = _run(x, shards, n, None, gemm.MmaConfig(4, config.splits), epilogue, wgmma_form=False)
        close(_run(x, shards, n, None, config, epilogue), mma)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["NVFP4", "FP8", "IQ2_XS", "FP8_BLOCK"])
def test_repeats_are_bit_identical_and_graphs_replay(rng, hopper, fmt):
    """Every token tile, K whole and split; two in a CUDA graph replayed on new inputs."""
    from graphs import capture

    from b12x_core.tensor_core import gemm, geometry, wgmma

    factor = fmt in FACTOR_FORMATS  # tiles up to 64 tokens
    n, k = 384, 8 * geometry.chunk_k(fmt)
    qw, shards = _case(rng, fmt, n, k)
    w64 = torch.from_numpy(bf.dequantize(qw)).double()
    x = torch.randn(37, k, device="cuda").to(torch.bfloat16)
    dense = [gemm.MmaConfig(mt, splits) for mt in (FACTOR_MTS if factor else MTS) for splits in (1, 4)]
    if fmt in wgmma.WIDE_FORMATS:  # 256-row CTAs
        dense += [
            gemm.MmaConfig(mt, splits, tiles=wgmma.WIDE_TILES) for mt in wgmma.WIDE_TOKEN_TILES for splits in (1, 4)
        ]
    for config in dense:
        first = _run(x, shards, n, None, config)
        assert torch.equal(first, _run(x, shards, n, None, config)), config
    y = torch.empty(37, n, dtype=torch.bfloat16, device="cuda")
    staged = torch.empty(wgmma.staged_bytes(fmt, 37, k), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream
    wide = [] if fmt not in wgmma.WIDE_FORMATS else [gemm.MmaConfig(16, 4, tiles=wgmma.WIDE_TILES)]
    for config in (gemm.MmaConfig(2, 4), gemm.MmaConfig(8, 4), *wide):
        ws = gemm.MmaWorkspace.create(37, n, config.splits, config.mt, "cuda")
        graph, _ = capture(lambda: wgmma.run(x, shards, y, None, config, ws, staged, stream().cuda_stream))  # noqa: B023
        for _ in range(3):
            x.copy_(torch.randn_like(x, dtype=torch.float32).to(torch.bfloat16))
            y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            close(y, x.double().cpu() @ w64.T)


@pytest.mark.gpu
@pytest.mark.parametrize("merge", [True, False], ids=["one launch", "a launch per shard"])
def test_fused_shards_write_their_columns(rng, hopper, merge):
    from b12x_core.tensor_core import gemm

    qws = [bf.quantize(rng.standard_normal((n, 256)).astype(np.float32), "NVFP4") for n in (48, 80)]
    shards = gemm.prepare(qws, "cuda", merge=merge)
    w64 = torch.cat([torch.from_numpy(bf.dequantize(q)).double() for q in qws])
    x = torch.randn(5, 256, device="cuda").to(torch.bfloat16)
    for mt in (1, 4):
        close(_run(x, shards, 128, None, gemm.MmaConfig(mt, 1)), x.double().cpu() @ w64.T)


def _grouped(form, args, a, y, slots, workspace, table, mt, fmt, k):
    """One grouped call through either form (the wgmma form with its staging scratch for the table's blocks)."""
    from b12x_core.tensor_core import gemm, wgmma

    stream = torch.cuda.current_stream().cuda_stream
    if form == "mma":
        gemm.launch(args, a, y, slots, workspace, stream, table=table)
        return
    rows = table[1].shape[1] * 8 * mt
    staged = torch.empty(wgmma.staged_bytes(fmt, rows, k), dtype=torch.uint8, device="cuda")
    wgmma.launch(args, a, y, slots, workspace, staged, stream, table=table)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["NVFP4", "MXFP4", "Q8_0", "IQ2_XS", "IQ2_XXS"])
def test_grouped_form_equals_the_mma_kernels_grouped_form(rng, hopper, fmt):
    """A fused MoE's two GEMMs over a block table (gate/up: the slots' input rows gathered, SiLU of the interleaved
    gate / up rows; down: float32 slot rows per K split) on the prepared expert stacks of the tensor-core MoE
    backend: the wgmma form with 32-, 64- and 128-token blocks (IQ2, whose per-chunk factor takes a second
    accumulator set: 32 and 64), equal the mma.sync form (32-token blocks, the largest it has) slot by slot, up to the summation order; split-K tickets
    left zero."""
    from test_moe_tiles import alone, problem

    from b12x_core.backends.tensor_core_moe import TensorCoreMoE
    from b12x_core.moe_blocks import block_table
    from b12x_core.tensor_core import gemm

    iq2 = fmt.startswith("IQ2")
    e, h, inter, t, top_k = 8, 512, 256 if iq2 else 128, 45, 2  # IQ2: w2's K whole 256-blocks
    x, w13, w2, _, ids = problem(rng, fmt, "bf16", "silu", e=e, h=h, inter=inter, t=t, top_k=top_k)
    p = bc.prepare_moe(w13, w2, activation="silu", max_tokens=t, top_k=top_k, device="cuda")
    moe = alone(p, w13, w2, backend=TensorCoreMoE).rows[0].backend
    x, ids, slots, rows13 = x.cuda(), ids.cuda(), t * top_k, moe.w13.shard.n

    def both_gemms(form, mt, s13, s2, act_in=None):
        """(SiLU activations, down rows summed over the K splits) of one form under 8·mt-token blocks; the down
        GEMM reads `act_in` when given (the reference's activations), else its own."""
        table = block_table(ids, e, 8 * mt)
        args13 = moe.w13.shard.args(gemm.MmaConfig(mt, s13), inter, "silu", moe.w13.row_scale, top_k)
        args2 = moe.w2.shard.args(gemm.MmaConfig(mt, s2), 0, "f32", moe.w2.row_scale)
        slabs = min(s2, moe.w2.shard.chunks)  # the plan splits K at most into its chunks: one float32 slab each
        tickets = torch.zeros(table[1].shape[1] * -(-rows13 // 128), dtype=torch.int32, device="cuda")
        partial13 = torch.empty(s13 * slots * rows13, dtype=torch.float32, device="cuda")
        act = torch.full((slots, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
        _grouped(form, args13, x, act, slots, gemm.MmaWorkspace(partial13, tickets), table, mt, fmt, h)
        out = torch.full((slabs, slots, h), float("nan"), dtype=torch.float32, device="cuda")
        down_in = act if act_in is None else act_in
        _grouped(form, args2, down_in, None, slots, gemm.MmaWorkspace(out, tickets), table, mt, fmt, inter)
        torch.cuda.synchronize()
        assert not tickets.any(), "the split-K tickets are left zero"
        return act, out.sum(0).to(torch.bfloat16)

    for s13, s2 in ((1, 1), (2, 3)):
        act_mma, down_mma = both_gemms("mma", 4, s13, s2)
        for mt in (4, 8) if iq2 else (4, 8, 16):
            act_wg, down_wg = both_gemms("wgmma", mt, s13, s2, act_in=act_mma)
            close(act_wg, act_mma)
            close(down_wg, down_mma)
