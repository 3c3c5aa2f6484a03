"""Activation quantization for the block-scaled modes whose x̂ bf16 holds exactly, in one pass over x:

- mxfp8: per 32 channels s = 2^(floor(log2 amax) − 8) (2^-127 for all-zero groups), x̂ = e4m3(clamp(x/s, ±448))·s
- nvfp4: per 16 channels sf = e4m3(amax/6 · g) with g = 1/input_scale, x̂ = e2m1(x · g/sf) · sf (the per-tensor
  input_scale is the caller's epilogue factor)

The rules are b12x_core.activations' (the contract); rounding is done arithmetically on float32 bit patterns
(ties to even, saturating), so the result does not depend on a conversion instruction.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _round_e4m3(v):
    """float32 -> the nearest E4M3 value (ties to even), saturating at ±448, as float32."""
    a = tl.minimum(tl.abs(v), 448.0)
    bits = a.to(tl.uint32, bitcast=True)
    # normals (a >= 2^-6): keep 3 mantissa bits, round half to even on the dropped 20
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    # subnormals: multiples of 2^-9; adding 2^23·1.5 rounds to an integer, ties to even
    sub = ((a * 512.0 + 12582912.0) - 12582912.0) * (1.0 / 512.0)
    r = tl.where(a < 0.015625, sub, normal)
    return tl.where(v < 0, -r, r)


@triton.jit
def _round_e2m1(v):
    """float32 -> the nearest E2M1 value {0, .5, 1, 1.5, 2, 3, 4, 6} (ties to the even code), saturating."""
    a = tl.abs(v)
    r = tl.where(a <= 0.25, 0.0, 0.5)
    r = tl.where(a >= 0.75, 1.0, r)
    r = tl.where(a > 1.25, 1.5, r)
    r = tl.where(a >= 1.75, 2.0, r)
    r = tl.where(a > 2.5, 3.0, r)
    r = tl.where(a >= 3.5, 4.0, r)
    r = tl.where(a > 5.0, 6.0, r)
    return tl.where(v < 0, -r, r)


@triton.jit
def _quantize(x_ptr, out_ptr, M, K, global_scale, MODE: tl.constexpr, GROUP: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.reshape(x, (BLOCK_M, BLOCK_K // GROUP, GROUP))
    amax = tl.max(tl.abs(g), axis=2)[:, :, None]
    if MODE == 0:  # mxfp8
        biased = ((amax.to(tl.uint32, bitcast=True) >> 23) & 255).to(tl.int32)  # floor(log2 amax) + 127
        exponent = tl.where(amax > 0, tl.maximum(biased - 127 - 8, -127), -127)  # <= 119 for any float32 amax
        scale = tl.where(exponent >= -126, ((exponent + 127) << 23).to(tl.float32, bitcast=True), 5.877471754111438e-39)
        inv = ((127 - exponent) << 23).to(tl.float32, bitcast=True)  # 2^-exponent, exactly
        xh = _round_e4m3(g * inv) * scale
    else:  # nvfp4
        sf = _round_e4m3(tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)) * global_scale)
        out_scale = tl.where(sf > 0, tl.math.div_rn(tl.full(sf.shape, global_scale, tl.float32), sf), 0.0)
        xh = _round_e2m1(g * out_scale) * sf
    tl.store(out_ptr + offs_m[:, None] * K + offs_k[None, :], tl.reshape(xh, (BLOCK_M, BLOCK_K)).to(tl.bfloat16),
             mask=mask)  # fmt: skip


def quantize_activation(x, mode: str, out, global_scale: float = 1.0):
    """out[M, K] bf16 = x̂ of `mode` ("mxfp8" or "nvfp4"); x [M, K] bf16 contiguous (a last partial group counts
    as zero-padded, as in the reference).
    For nvfp4, global_scale = float32(1 / input_scale)."""
    if mode not in ("mxfp8", "nvfp4"):
        raise ValueError(f"quantize_activation: mode must be 'mxfp8' or 'nvfp4', got {mode!r}")
    m, k = x.shape
    group = 32 if mode == "mxfp8" else 16
    block_k = 128 if k % 128 == 0 else group
    grid = (triton.cdiv(m, 16), triton.cdiv(k, block_k))
    _quantize[grid](x, out, m, k, global_scale, MODE=0 if mode == "mxfp8" else 1, GROUP=group, BLOCK_M=16,
                    BLOCK_K=block_k, num_warps=4)  # fmt: skip
    return out
