"""The tensor-core mixed-input GEMM on the GPU against a float64 oracle of the checkpoint's values (closeness
contract of closeness.py): every format, M ∈ {1, 3, 16, 33, 100, 257, 1000}, N and K at their smallest legal
multiples and at odd multiples, with bias, outputs poisoned first; every token tile and several K splits
(the in-order split reduction included); bit-identical repeats; CUDA graph replay with new inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from closeness import close, rounding_slack
from graphs import capture

import b12x_formats as bf
from b12x_core.tensor_core import gemm, geometry

pytestmark = pytest.mark.gpu
FORMATS = ["FP8", "FP8_BLOCK", "MXFP8", "NVFP4", "MXFP4", "Q8_0", "IQ2_XXS", "IQ2_XS"]
MS = [1, 3, 16, 33, 100, 257, 1000]


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def _case(rng, fmt, n, k):
    w = rng.standard_normal((n, k)).astype(np.float32)
    qw = bf.quantize(w, fmt)
    shards = gemm.prepare([qw], "cuda")
    return torch.from_numpy(bf.dequantize(qw)).double(), shards


def _run(x, shards, n, bias, config, x_quant="none", x_quant_scale=0.0):
    m = x.shape[0]
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    ws = gemm.MmaWorkspace.create(m, n, config.splits, config.mt, "cuda", row_tiles=config.tiles)
    stream = torch.cuda.current_stream().cuda_stream
    gemm.run(x, shards, y, bias, config, ws, stream, x_quant=x_quant, x_quant_scale=x_quant_scale)
    assert int(ws.tickets.abs().sum()) == 0  # left ready for the next call
    return y


def _shapes(fmt):
    km = math.lcm(bf.spec(fmt).k_multiple, 8)  # the kernel stages activations in 16-byte pieces
    ck = geometry.chunk_k(fmt)
    return [(16, km), (200, 3 * km), (136, 7 * ck + km)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_the_oracle(rng, fmt):
    for n, k in _shapes(fmt):
        w64, shards = _case(rng, fmt, n, k)
        bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to("cuda", torch.bfloat16)
        for m in MS:
            x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to("cuda", torch.bfloat16)
            ref = x.double().cpu() @ w64.T + bias.double().cpu()
            chunks = shards[0].chunks
            for mt in geometry.TOKEN_TILES:
                for rt in (1, 2):
                    for splits in sorted({1, min(3, chunks), chunks}):
                        y = _run(x, shards, n, bias, gemm.MmaConfig(mt, splits, rt))
                        close(y, ref, slack=rounding_slack(fmt, x, w64))


@pytest.mark.parametrize("fmt", FORMATS)
def test_shorter_ctas_sum_as_the_full_ones(rng, fmt):
    """One-token tiles in CTAs of 6 or 7 row tiles (MmaConfig.tiles, the balanced heights): each row tile's chunks in the same
    order and the same split reduction, so the same bits as CTAs of 8, and the oracle's values; N with a last CTA
    of a few live rows, splits shorter than the ring."""
    for n, k in _shapes(fmt):
        w64, shards = _case(rng, fmt, n, k)
        chunks = shards[0].chunks
        for m in (1, 5, 19):
            x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to("cuda", torch.bfloat16)
            ref = x.double().cpu() @ w64.T
            for splits in sorted({1, min(3, chunks), chunks}):
                full = _run(x, shards, n, None, gemm.MmaConfig(1, splits))
                for tiles in (6, 7):
                    short = _run(x, shards, n, None, gemm.MmaConfig(1, splits, tiles=tiles))
                    assert torch.equal(short, full), (tiles, splits, m, n, k)
                close(full, ref, slack=rounding_slack(fmt, x, w64))


@pytest.mark.parametrize("fmt", FORMATS)
def test_resident_activations_sum_as_the_staged_ones(rng, fmt):
    """Resident activations (MmaConfig.resident, every format's one-token form in the plans): each row tile's chunks in
    the same order and the same split reduction as the staged kernel, so the same bits, and the oracle's values; M
    below, at and past one tile of 8 tokens (rows past M are not held: their lanes read row 0 into columns never
    stored), splits shorter than the ring, CTA heights 8 and 7, bias."""
    for n, k in _shapes(fmt):
        w64, shards = _case(rng, fmt, n, k)
        chunks = shards[0].chunks
        bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to("cuda", torch.bfloat16)
        for m in (1, 3, 8, 19):
            x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to("cuda", torch.bfloat16)
            ref = x.double().cpu() @ w64.T + bias.double().cpu()
            for splits in sorted({1, min(3, chunks), chunks}):
                for tiles in (8, 7):
                    staged = _run(x, shards, n, bias, gemm.MmaConfig(1, splits, tiles=tiles))
                    resident = _run(x, shards, n, bias, gemm.MmaConfig(1, splits, tiles=tiles, resident=True))
                    assert torch.equal(resident, staged), (tiles, splits, m, n, k)
                close(resident, ref, slack=rounding_slack(fmt, x, w64))


def _held_values_oracle(x, mode, scale):
    """The values an activation mode's operand pass writes (b12x_core.activations' rules: fp8 static codes,
    mxfp8 e4m3 · 2^e a 32-group, nvfp4 e2m1 · sf a 16-group without its per-tensor factor), in float64 and
    ml_dtypes roundings, independent of the kernels; x float32 [M, K], `scale` fp8 static's or nvfp4's global."""
    import ml_dtypes

    m, k = x.shape
    if mode == "fp8_static":
        return np.clip(x / np.float32(scale), -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    group = 32 if mode == "mxfp8" else 16
    g = np.pad(x, ((0, 0), (0, -k % group))).reshape(m, -1, group)
    amax = np.abs(g).max(axis=2, keepdims=True)
    if mode == "mxfp8":
        _, e = np.frexp(np.where(amax > 0, amax, 1).astype(np.float64))
        exponent = np.where(amax > 0, np.maximum(e - 1 - 8, -127), -127).astype(np.float64)
        codes = np.clip(g.astype(np.float64) * 2.0**-exponent, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        values = codes.astype(np.float64) * 2.0**exponent
    else:
        gs = np.float32(scale)
        sf = np.clip((amax / np.float32(6)).astype(np.float32) * gs, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        sf = sf.astype(np.float32)
        inv = np.where(sf > 0, gs / np.where(sf > 0, sf, 1), np.float32(0)).astype(np.float32)
        codes = np.clip(g * inv, -6, 6).astype(ml_dtypes.float4_e2m1fn)
        values = codes.astype(np.float64) * sf.astype(np.float64)
    return values.reshape(m, -1)[:, :k]


@pytest.mark.parametrize(
    "fmt,mode", sorted((fmt, mode) for mode, formats in geometry.MMA.x_quant_formats.items() for fmt in formats)
)
def test_activations_quantized_where_held(rng, fmt, mode):
    """x_quant (resident configurations; the plans pass it there): the kernel quantizes the rows it holds as the
    activation mode, the same bits as the operand pass (b12x_kernels.act_quant) followed by the resident kernel,
    and the oracle's values (_held_values_oracle) times the weights. Values span tiny, normal and saturating ones
    (the scales are half what the largest value needs); M below and at one tile, splits, heights 8 and 7, bias."""
    from b12x_core.backends import operands

    for n, k in _shapes(fmt):
        w64, shards = _case(rng, fmt, n, k)
        chunks = shards[0].chunks
        bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to("cuda", torch.bfloat16)
        for m in (1, 3, 8):
            spread = rng.choice([1e-4, 1.0, 30.0], size=(m, k))
            x = torch.from_numpy((rng.standard_normal((m, k)) * spread).astype(np.float32)).to("cuda", torch.bfloat16)
            amax = x.float().abs().max().item()
            input_scale = {"fp8_static": amax / 448 * 0.5, "nvfp4": amax / (448 * 6) * 0.5}.get(mode)
            values, _ = operands.bf16_operands(x, mode, input_scale, [torch.empty_like(x), None])  # the backend's
            scale = operands.in_kernel_scale(mode, input_scale)
            x_hat = torch.from_numpy(_held_values_oracle(x.float().cpu().numpy(), mode, scale))
            assert torch.equal(values.double().cpu(), x_hat)  # the operand pass itself against the oracle
            ref = x_hat @ w64.T + bias.double().cpu()
            for splits in sorted({1, min(3, chunks), chunks}):
                for tiles in (8, 7):
                    config = gemm.MmaConfig(1, splits, tiles=tiles, resident=True)
                    fused = _run(x, shards, n, bias, config, x_quant=mode, x_quant_scale=scale)
                    assert torch.equal(fused, _run(values, shards, n, bias, config)), (tiles, splits, m, n, k)
                close(fused, ref, slack=rounding_slack(fmt, x_hat, w64))


def test_cta_heights_the_kernel_lacks_are_refused(rng):
    _, shards = _case(rng, "NVFP4", 32, 256)
    x = torch.randn(2, 256, device="cuda").to(torch.bfloat16)
    for config in (gemm.MmaConfig(2, 1, tiles=7), gemm.MmaConfig(1, 1, rt=2, tiles=6), gemm.MmaConfig(1, 1, tiles=5)):
        with pytest.raises(ValueError, match="tiles"):
            _run(x, shards, 32, None, config)


@pytest.mark.parametrize("fmt", ["NVFP4", "IQ2_XS", "FP8_BLOCK"])
def test_repeats_are_bit_identical_and_graphs_replay(rng, fmt):
    n, k = 384, 8 * geometry.chunk_k(fmt)
    w64, shards = _case(rng, fmt, n, k)
    config = gemm.MmaConfig(2, 5, 2)
    x = torch.randn(13, k, device="cuda").to(torch.bfloat16)
    first = _run(x, shards, n, None, config)
    assert torch.equal(first, _run(x, shards, n, None, config))
    y = torch.empty(13, n, dtype=torch.bfloat16, device="cuda")
    ws = gemm.MmaWorkspace.create(13, n, config.splits, config.mt, "cuda")
    graph, _ = capture(lambda: gemm.run(x, shards, y, None, config, ws, torch.cuda.current_stream().cuda_stream))
    for _ in range(3):
        x.copy_(torch.randn_like(x, dtype=torch.float32).to(torch.bfloat16))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        close(y, x.double().cpu() @ w64.T)


@pytest.mark.parametrize("merge", [True, False], ids=["one launch", "a launch per shard"])
def test_fused_shards_write_their_columns(rng, merge):
    qws = [bf.quantize(rng.standard_normal((n, 256)).astype(np.float32), "NVFP4") for n in (48, 80)]
    shards = gemm.prepare(qws, "cuda", merge=merge)
    assert len(shards) == (1 if merge else 2)
    w64 = torch.cat([torch.from_numpy(bf.dequantize(q)).double() for q in qws])
    x = torch.randn(5, 256, device="cuda").to(torch.bfloat16)
    y = _run(x, shards, 128, None, gemm.MmaConfig(1, 2))
    close(y, x.double().cpu() @ w64.T)
