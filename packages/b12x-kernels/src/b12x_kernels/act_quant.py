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

from .format_facts import E4M3_MAX, FP8_BLOCK_SIZE, MX_GROUP, NVFP4_GROUP

# fp8_token's columns per step: one program walks its token's row twice (amax, then codes); 16 tokens × 128
# columns per program left decode-sized calls on one SM walking K in 128 serial steps (an 8192-wide FP8 × fp8
# per-token linear at M=1 took as long as the whole layer should, every backend alike: benchmarks/decode_kernels.py).
TOKEN_BLOCK_K = 1024
# Below this many tokens fp8_token also splits each row's codes over K / TOKEN_BLOCK_K programs (each re-reads the row
# for its amax, a few KB from L2): one program per token left a one-token call on one SM dividing 4096-14336 values,
# longer per Llama-3.1-8B linear than the GEMV itself (`benchmarks/decode_kernels.py --formats FP8` re-measures it).
TOKEN_SPLIT_BELOW = 64


@triton.jit
def _round_e4m3(v):
    """float32 -> the nearest E4M3 value (ties to even), saturating at ±448, as float32."""
    a = tl.minimum(tl.abs(v), E4M3_MAX)
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


@triton.jit(do_not_specialize=["M"])  # one compile for every batch size
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
    group = MX_GROUP.value if mode == "mxfp8" else NVFP4_GROUP.value
    block_k = FP8_BLOCK_SIZE.value if k % FP8_BLOCK_SIZE.value == 0 else group
    grid = (triton.cdiv(m, 16), triton.cdiv(k, block_k))
    _quantize[grid](x, out, m, k, global_scale, MODE=0 if mode == "mxfp8" else 1, GROUP=group, BLOCK_M=16,
                    BLOCK_K=block_k, num_warps=4)  # fmt: skip
    return out


@triton.jit
def _e4m3_code(r):
    """An E4M3 value (float32, |r| ≤ 448) -> its uint8 code."""
    a = tl.abs(r)
    bits = a.to(tl.uint32, bitcast=True)
    normal = (((bits >> 23).to(tl.int32) - 120) << 3) | ((bits >> 20) & 7).to(tl.int32)
    code = tl.where(a >= 0.015625, normal, (a * 512.0).to(tl.int32))
    return (code | tl.where(r < 0, 128, 0)).to(tl.uint8)


@triton.jit(do_not_specialize=["M", "ROWS", "SCALE_STRIDE_M", "SCALE_STRIDE_G"])  # one compile per mode and layer
def _quantize_fp8(x_ptr, q_ptr, scale_ptr, M, ROWS, K, static_scale, SCALE_STRIDE_M, SCALE_STRIDE_G,
                  MODE: tl.constexpr, STATIC_COLUMN: tl.constexpr, VALUES: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_K: tl.constexpr):  # fmt: skip
    """MODE 0: static per-tensor scale (a program per BLOCK_M tokens × BLOCK_K columns; STATIC_COLUMN: also
    static_scale into scale_ptr [ROWS] for every row); 1: per token (scale_ptr [ROWS]; a program per BLOCK_M tokens,
    all of K); 2: per token × 128 (scale_ptr [ROWS, ⌈K/128⌉], BLOCK_K == 128, one program per column group).
    VALUES: store each code's value as bf16 (exact) instead of its uint8 code, for kernels that multiply bf16.
    Scales sit at scale_ptr + m·SCALE_STRIDE_M + g·SCALE_STRIDE_G (row- or column-major, as the consuming GEMM
    wants). Rows M..ROWS-1 (padding a GEMM wants) are read as all-zero tokens, so the same rules write them:
    zero codes, and an all-zero token's scale (1; fp8_static's own scale)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_in = offs_m < M  # rows read from x
    m_ok = offs_m < ROWS  # rows written
    if MODE == 1:  # every program of a token walks its whole row for the amax, then codes its own K slice
        amax = tl.zeros((BLOCK_M,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_in[:, None] & (offs_k[None, :] < K),
                        other=0.0).to(tl.float32)  # fmt: skip
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
        s = tl.math.div_rn(amax, tl.full(amax.shape, E4M3_MAX, tl.float32))
        s = tl.where(s > 0, s, 1.0)
        if tl.program_id(1) == 0:
            tl.store(scale_ptr + offs_m * SCALE_STRIDE_M, s, mask=m_ok)
        if tl.num_programs(1) == 1:
            k_first = 0
            k_steps = K
        else:
            k_first = tl.program_id(1) * BLOCK_K
            k_steps = BLOCK_K
    elif MODE == 2:
        k_first = tl.program_id(1) * BLOCK_K
        offs_k = k_first + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_in[:, None] & (offs_k[None, :] < K),
                    other=0.0).to(tl.float32)  # fmt: skip
        s = tl.math.div_rn(tl.max(tl.abs(x), axis=1), tl.full((BLOCK_M,), E4M3_MAX, tl.float32))
        s = tl.where(s > 0, s, 1.0)
        tl.store(scale_ptr + offs_m * SCALE_STRIDE_M + tl.program_id(1) * SCALE_STRIDE_G, s, mask=m_ok)
        k_steps = BLOCK_K
    else:  # static: every element on its own, so programs split K too
        s = tl.full((BLOCK_M,), static_scale, tl.float32)
        if STATIC_COLUMN:
            if tl.program_id(1) == 0:
                tl.store(scale_ptr + offs_m * SCALE_STRIDE_M, s, mask=m_ok)
        k_first = tl.program_id(1) * BLOCK_K
        k_steps = BLOCK_K
    for k0 in range(k_first, k_first + k_steps, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k[None, :] < K
        x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_in[:, None] & k_ok, other=0.0).to(tl.float32)
        q = _round_e4m3(tl.math.div_rn(x, tl.broadcast_to(s[:, None], x.shape)))
        if VALUES:
            tl.store(q_ptr + offs_m[:, None] * K + offs_k[None, :], q.to(tl.bfloat16), mask=m_ok[:, None] & k_ok)
        else:
            tl.store(q_ptr + offs_m[:, None] * K + offs_k[None, :], _e4m3_code(q), mask=m_ok[:, None] & k_ok)


def quantize_fp8(x, mode: str, q_out, scale_out=None, static_scale: float = 1.0, rows: int | None = None):
    """e4m3 codes of x [M, K] bf16 into q_out (uint8 [rows, K]: view it as float8_e4m3fn; or bf16 [rows, K]: the
    codes' values, exact), as b12x_core.activations.fp8_operands: mode "fp8_static" (static_scale; scale_out
    [rows] or [rows, 1], optional, gets static_scale in every row: the row-wise scale column a GEMM reads),
    "fp8_token" (scale_out [rows] or [rows, 1]) or "fp8_group128" (scale_out [rows, ⌈K/128⌉], any strides: a
    transposed view gives the column-major scales cuBLASLt's block-wise GEMM reads).

    rows (default M, at least M): the rows written, in the same single launch; rows M..rows-1 are quantized as
    all-zero tokens (zero codes; scale 1, fp8_static's scale for fp8_static), the padding cuBLASLt's fp8 layouts
    want."""
    modes = {"fp8_static": 0, "fp8_token": 1, "fp8_group128": 2}
    if mode not in modes:
        raise ValueError(f"quantize_fp8: mode must be one of {list(modes)}, got {mode!r}")
    m, k = x.shape
    rows = m if rows is None else rows
    if rows < m:
        raise ValueError(f"quantize_fp8: rows ({rows}) must be at least the {m} tokens of x")
    if q_out.shape[0] < rows or (scale_out is not None and scale_out.shape[0] < rows):
        shapes = (tuple(q_out.shape), None if scale_out is None else tuple(scale_out.shape))
        raise ValueError(f"quantize_fp8: outputs {shapes} hold fewer than the {rows} rows to write")
    if mode != "fp8_static" and scale_out is None:
        raise ValueError(f"quantize_fp8: {mode} writes scales: scale_out is required")
    group = FP8_BLOCK_SIZE.value  # fp8_group128's groups; the static mode steps by it too
    if mode == "fp8_token":  # programs per token: its amax needs the whole row; few tokens also split the codes
        slices = triton.cdiv(k, TOKEN_BLOCK_K) if m < TOKEN_SPLIT_BELOW else 1
        block_m, block_k, grid = 1, TOKEN_BLOCK_K, (rows, slices)
    else:  # a program per 16 tokens × 128 columns
        block_m, block_k, grid = 16, group, (triton.cdiv(rows, 16), triton.cdiv(k, group))
    values = q_out.element_size() == 2
    column = mode == "fp8_static" and scale_out is not None
    strides = (0, 0) if scale_out is None else (scale_out.stride(0), scale_out.stride(1) if scale_out.dim() > 1 else 0)
    _quantize_fp8[grid](x, q_out, q_out if scale_out is None else scale_out, m, rows, k, static_scale, *strides,
                        MODE=modes[mode], STATIC_COLUMN=column, VALUES=values, BLOCK_M=block_m, BLOCK_K=block_k,
                        num_warps=4)  # fmt: skip
    return q_out
