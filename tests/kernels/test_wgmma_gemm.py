"""The Hopper warpgroup-MMA prototype (b12x_kernels.wgmma_gemm, csrc/wgmma_gemm.cu; b12x_core.tensor_core.wgmma).

On CPU: the binding refuses plans it cannot run before any CUDA call. On an sm_90 GPU (marked gpu): every format it
runs, random weights, M ∈ {1, 7, 8, 37, 64, 129, 200} under every token tile that the M needs and more, N with a
tail (a partial row tile, a partial CTA, a dead warpgroup), K over several chunks plus a tail chunk, bias on and
off, outputs poisoned with NaN first, against the b12x-core reference (closeness.py) and the mma.sync kernel's
result over the same repacked weights; repeats bit-identical; CUDA graph replay with new inputs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from closeness import close

import b12x_core as bc
import b12x_formats as bf
from b12x_formats.kernel_facts import format_id

FORMATS = ["FP8", "MXFP8", "NVFP4", "MXFP4", "Q8_0"]
MS = [1, 7, 8, 37, 64, 129, 200]
NTS = [1, 2, 4, 8, 16]


# ---------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize(
    "plan,call,why",
    [
        (dict(format=format_id("FP8_BLOCK")), {}, "format must be"),
        (dict(format=format_id("IQ2_XS")), {}, "format must be"),
        (dict(format=99), {}, "format must be"),
        (dict(nt=3), {}, "nt must be"),
        (dict(nt=32), {}, "nt must be"),
        (dict(K=100), {}, "K % 8"),
        (dict(chunks=0), {}, "fewer than K columns"),
        (dict(K=256), {}, "fewer than K columns"),  # one NVFP4 chunk holds 128
        (dict(codes=8), {}, "misaligned codes"),
        (dict(codes=0), {}, "misaligned codes"),
        (dict(meta=0), {}, "block scales"),
        (dict(ldy=16), {}, "ldy >= N"),
        ({}, dict(M=0), "M >= 1"),
        ({}, dict(x=8), "misaligned x"),
        ({}, dict(y=0), "misaligned x / y"),
        ("short", {}, "interface.h differ"),
    ],
)
def test_kernel_entry_refuses_what_it_cannot_run_before_launching(plan, call, why):
    """The extension's checks run before any CUDA call, so they hold on a machine without a GPU too."""
    import b12x_kernels
    from b12x_kernels import interface

    if b12x_kernels._C is None:
        pytest.skip(b12x_kernels.unavailable_reason())
    if not hasattr(b12x_kernels._C, "wgmma_gemm"):
        pytest.skip("the installed b12x_kernels._C predates wgmma_gemm")
    fake = 16  # an aligned non-null address: the checks refuse before anything reads it
    fields = dict(format=format_id("NVFP4"), codes=fake, meta=fake, meta2=0, alpha=1.0, scale_mul=1.0, ldy=32, N=32,
                  K=128, chunks=1, nt=1)  # fmt: skip
    packed = b"\0" * 8 if plan == "short" else interface.pack(interface.WgmmaPlan, **{**fields, **plan})
    args = dict(x=fake, bias=0, y=fake, M=1, stream=0)
    with pytest.raises(ValueError, match=why):
        b12x_kernels.wgmma_gemm(packed, **{**args, **call})


def test_plan_packs_the_shard_and_caches_it():
    from b12x_core.tensor_core import gemm, wgmma
    from b12x_kernels import interface

    codes = torch.zeros(1024, dtype=torch.uint8)
    shard = gemm.MmaShard("NVFP4", format_id("NVFP4"), 0, 16, 128, 1, codes, codes, None, None, None, 0.5, 4.0)
    first = wgmma.plan(shard, 4, 48)
    assert wgmma.plan(shard, 4, 48) is first
    back = interface.WgmmaPlan.from_buffer_copy(first)
    assert (back.format, back.codes, back.meta, back.meta2, back.N, back.K, back.chunks, back.nt, back.ldy) == (
        format_id("NVFP4"), codes.data_ptr(), codes.data_ptr(), 0, 16, 128, 1, 4, 48)  # fmt: skip
    assert (back.alpha, back.scale_mul) == (0.5, 4.0)
    assert [wgmma.token_tile(m) for m in (1, 8, 9, 64, 65, 128, 1000)] == [1, 1, 2, 8, 16, 16, 16]
    assert wgmma.FORMATS == tuple(FORMATS) and wgmma.TOKEN_TILES == tuple(NTS)


# ---------------------------------------------------------------------------------------------- GPU


@pytest.fixture
def hopper():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma_gemm runs on sm_90 (Hopper) only")


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


def _wgmma(x, shards, n, bias, nt):
    from b12x_core.tensor_core import wgmma

    y = torch.full((x.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
    wgmma.run(x, shards, y, bias, nt, torch.cuda.current_stream().cuda_stream)
    return y


def _mma(x, shards, n, bias):
    from b12x_core.tensor_core import gemm, geometry

    m = x.shape[0]
    config = gemm.MmaConfig(geometry.token_tile(m), 1)
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    ws = gemm.MmaWorkspace.create(m, n, config.splits, config.mt, "cuda")
    gemm.run(x, shards, y, bias, config, ws, torch.cuda.current_stream().cuda_stream)
    return y


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_the_reference_and_the_mma_kernel(rng, hopper, fmt):
    for n, k in _shapes(fmt):
        qw, shards = _case(rng, fmt, n, k)
        cpu = bc.prepare_linear(qw, max_tokens=max(MS))
        bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)
        for m in MS:
            x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
            xg = x.cuda()
            for b in (None, bias):
                ref = bc.linear(x, cpu, b)
                bg = None if b is None else b.cuda()
                mma = _mma(xg, shards, n, bg)
                close(mma, ref)
                for nt in NTS:
                    y = _wgmma(xg, shards, n, bg, nt)
                    torch.cuda.synchronize()
                    close(y, ref)
                    close(y, mma)  # the same weights through the same decode: only the summation order differs


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["NVFP4", "FP8"])
def test_repeats_are_bit_identical_and_graphs_replay(rng, hopper, fmt):
    from graphs import capture

    from b12x_core.tensor_core import geometry, wgmma

    n, k = 384, 8 * geometry.chunk_k(fmt)
    qw, shards = _case(rng, fmt, n, k)
    w64 = torch.from_numpy(bf.dequantize(qw)).double()
    x = torch.randn(37, k, device="cuda").to(torch.bfloat16)
    for nt in NTS:
        first = _wgmma(x, shards, n, None, nt)
        assert torch.equal(first, _wgmma(x, shards, n, None, nt))
    y = torch.empty(37, n, dtype=torch.bfloat16, device="cuda")
    graph, _ = capture(lambda: wgmma.run(x, shards, y, None, 2, torch.cuda.current_stream().cuda_stream))
    for _ in range(3):
        x.copy_(torch.randn_like(x, dtype=torch.float32).to(torch.bfloat16))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        close(y, x.double().cpu() @ w64.T)


@pytest.mark.gpu
def test_fused_shards_write_their_columns(rng, hopper):
    from b12x_core.tensor_core import gemm

    qws = [bf.quantize(rng.standard_normal((n, 256)).astype(np.float32), "NVFP4") for n in (48, 80)]
    shards = gemm.prepare(qws, "cuda")
    w64 = torch.cat([torch.from_numpy(bf.dequantize(q)).double() for q in qws])
    x = torch.randn(5, 256, device="cuda").to(torch.bfloat16)
    for nt in (1, 4):
        close(_wgmma(x, shards, 128, None, nt), x.double().cpu() @ w64.T)
