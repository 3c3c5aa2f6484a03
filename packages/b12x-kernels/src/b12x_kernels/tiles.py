"""Prefill (large-M) linear: Triton tiles that decode packed weights to bf16 (or keep fp8) in registers and
multiply on the tensor cores with fp32 accumulation. One source for SM90 and SM12x.

y[m, n] = (Σ_k x[m, k] · w[n, k] · group_scale) · col_scale[n] · token_scale[m] + bias[n]

- x: bf16, or fp8 e4m3 for FP8/FP8_BLOCK weights with fp8 activations (then the dot runs in fp8).
- w: decoded per format (FORMATS below) to values that bf16 holds exactly wherever the format allows
  (e4m3, e2m1·e4m3, e4m3·2^e); Q8_0 and IQ2 products d·q round once to bf16.
- col_scale [N] float32: per-tensor factors expanded per output row (FP8 weight_scale, NVFP4 weight_scale_2,
  a static activation scale), so fused shards with their own scales run as one weight.
- token_scale [M] float32 (optional): dynamic per-token activation scales.
- group scales: FP8_BLOCK's weight scales expanded to one row per output row ([N, ⌈K/128⌉], so fused shards of
  any height concatenate) and optional 1×128 activation scales [M, ⌈K/128⌉], applied per K step of 128.

This module only runs what it is told: every tile configuration (block sizes, warps, stages, K split) arrives
as an argument; b12x_core's plan picks it and prepares the inputs. Format numbers and block facts come from
format_facts.py, generated from b12x_formats.
"""

from __future__ import annotations

import triton
import triton.language as tl

from b12x_formats.kernel_facts import FORMAT_IDS, format_id

from .element_decode import e2m1_value, e8m0_value
from .format_facts import (
    E8M0_BIAS,
    FMT_FP8,
    FMT_FP8_BLOCK,
    FMT_IQ2_XXS,
    FMT_MXFP4,
    FMT_MXFP8,
    FMT_NVFP4,
    FMT_Q8_0,
    FP8_BLOCK_SIZE,
    IQ2_XS_BYTES,
    IQ2_XS_GROUP,
    IQ2_XS_QS_OFFSET,
    IQ2_XS_SCALES_OFFSET,
    IQ2_XXS_BYTES,
    IQ2_XXS_GROUP,
    IQ2_XXS_QS_OFFSET,
    MX_GROUP,
    NVFP4_GROUP,
    Q8_0_BYTES,
    Q8_0_GROUP,
    Q8_0_QS_OFFSET,
)

FORMATS = tuple(FORMAT_IDS)
# Every format steps one FP8 scale block along K: FP8_BLOCK's weight and 1×128 activation scales change once per
# step, and the other groups (MX, NVFP4, Q8_0, half an IQ2 superblock) divide it.
BLOCK_K = FP8_BLOCK_SIZE.value


@triton.jit
def _fp16_at(ptr):
    """The little-endian fp16 at byte pointer(s) `ptr`, as float32."""
    lo = tl.load(ptr).to(tl.uint16)
    hi = tl.load(ptr + 1).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _decode(w_ptr, s_ptr, grid_ptr, sign_ptr, offs_n, k0, N, K,
            FMT: tl.constexpr, KEEP_FP8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """Weight rows offs_n, columns k0 .. k0+BLOCK_K -> [BLOCK_N, BLOCK_K] bf16 (fp8 when KEEP_FP8)."""
    offs_n = offs_n.to(tl.int64)  # byte offsets of stacked experts pass 2^31 (DeepSeek-V3-sized: 3.8 GB)
    n = offs_n[:, None]
    n_ok = n < N
    if FMT == FMT_FP8 or (FMT == FMT_FP8_BLOCK or FMT == FMT_MXFP8):  # e4m3 elements, [N, K]
        k = k0 + tl.arange(0, BLOCK_K)[None, :]
        w = tl.load(w_ptr + n * K + k, mask=n_ok & (k < K), other=0.0)
        if FMT == FMT_MXFP8:  # one E8M0 scale per MX_GROUP along K
            G: tl.constexpr = BLOCK_K // MX_GROUP
            kg = k0 // MX_GROUP + tl.arange(0, G)[None, :]
            e = tl.load(s_ptr + n * (K // MX_GROUP) + kg, mask=n_ok & (kg < K // MX_GROUP), other=E8M0_BIAS)
            w3 = tl.reshape(w.to(tl.float32), (BLOCK_N, G, MX_GROUP)) * e8m0_value(e)[:, :, None]
            w = tl.reshape(w3, (BLOCK_N, BLOCK_K)).to(tl.bfloat16)
        elif not KEEP_FP8:
            w = w.to(tl.bfloat16)
        return w
    elif FMT == FMT_NVFP4 or FMT == FMT_MXFP4:  # e4m3 or E8M0 scale per group; bytes [N, K/2], low nibble first
        H: tl.constexpr = BLOCK_K // 2
        kb = k0 // 2 + tl.arange(0, H)[None, :]
        b = tl.load(w_ptr + n * (K // 2) + kb, mask=n_ok & (kb < K // 2), other=0).to(tl.int32)
        v = tl.reshape(tl.join(e2m1_value(b & 15), e2m1_value(b >> 4)), (BLOCK_N, BLOCK_K))
        GS: tl.constexpr = NVFP4_GROUP if FMT == FMT_NVFP4 else MX_GROUP
        G: tl.constexpr = BLOCK_K // GS
        kg = k0 // GS + tl.arange(0, G)[None, :]
        if FMT == FMT_NVFP4:
            s = tl.load(s_ptr + n * (K // GS) + kg, mask=n_ok & (kg < K // GS), other=0.0).to(tl.float32)
        else:
            s = e8m0_value(tl.load(s_ptr + n * (K // GS) + kg, mask=n_ok & (kg < K // GS), other=E8M0_BIAS))
        v3 = tl.reshape(v, (BLOCK_N, G, GS)) * s[:, :, None]
        return tl.reshape(v3, (BLOCK_N, BLOCK_K)).to(tl.bfloat16)
    elif FMT == FMT_Q8_0:  # blocks [N, K/Q8_0_GROUP, Q8_0_BYTES] = fp16 d, Q8_0_GROUP int8
        G: tl.constexpr = BLOCK_K // Q8_0_GROUP
        nb = K // Q8_0_GROUP
        blk = k0 // Q8_0_GROUP + tl.arange(0, G)[None, :, None]
        base = w_ptr + (offs_n[:, None, None] * nb + blk) * Q8_0_BYTES
        ok = (offs_n[:, None, None] < N) & (blk < nb)
        d = _fp16_at(tl.where(ok, base, w_ptr))
        q = tl.load(base + Q8_0_QS_OFFSET + tl.arange(0, Q8_0_GROUP)[None, None, :], mask=ok, other=0)
        q = q.to(tl.int8, bitcast=True)
        return tl.reshape(q.to(tl.float32) * d, (BLOCK_N, BLOCK_K)).to(tl.bfloat16)
    else:  # IQ2_XXS / IQ2_XS superblocks = groups of 8 weights (one grid entry each); a step covers part of one
        BYTES: tl.constexpr = IQ2_XXS_BYTES if FMT == FMT_IQ2_XXS else IQ2_XS_BYTES
        SUPER: tl.constexpr = IQ2_XXS_GROUP if FMT == FMT_IQ2_XXS else IQ2_XS_GROUP
        nb = K // SUPER
        n3 = offs_n[:, None, None]
        within = k0 - (k0 // SUPER) * SUPER  # k0 % SUPER (the interpreter's constexpr has no reflected %)
        g = within // 8 + tl.arange(0, BLOCK_K // 8)[None, :, None]
        e = tl.arange(0, 8)[None, None, :]
        ok = n3 < N
        base = w_ptr + tl.where(ok, n3 * nb + k0 // SUPER, 0) * BYTES
        d = _fp16_at(base)
        if FMT == FMT_IQ2_XXS:  # per 32: 4 grid bytes, then u32 (4 × 7 sign bits, 4-bit scale)
            sub = base + IQ2_XXS_QS_OFFSET + (g // 4) * 8
            grid_idx = tl.load(sub + (g % 4)).to(tl.int32)
            aux = tl.load(sub + 4).to(tl.uint32)
            aux |= tl.load(sub + 5).to(tl.uint32) << 8
            aux |= tl.load(sub + 6).to(tl.uint32) << 16
            aux |= tl.load(sub + 7).to(tl.uint32) << 24
            sign_idx = ((aux >> (7 * (g % 4)).to(tl.uint32)) & 127).to(tl.int32)
            nibble = (aux >> 28).to(tl.int32)
        else:  # 32 u16 (9-bit grid index, 7-bit sign index), then 8 bytes of two 4-bit scales
            q = tl.load(base + IQ2_XS_QS_OFFSET + 2 * g).to(tl.int32)
            q |= tl.load(base + IQ2_XS_QS_OFFSET + 1 + 2 * g).to(tl.int32) << 8
            grid_idx = q & 511
            sign_idx = q >> 9
            nibble = (tl.load(base + IQ2_XS_SCALES_OFFSET + g // 4).to(tl.int32) >> (4 * ((g // 2) % 2))) & 15
        db = d * (0.5 + nibble.to(tl.float32)) * 0.25  # llama.cpp's order of operations
        magnitude = ((tl.load(grid_ptr + grid_idx) >> (8 * e).to(tl.int64)) & 255).to(tl.float32)
        negative = (tl.load(sign_ptr + sign_idx).to(tl.int32) >> e) & 1
        v = tl.where(negative != 0, -magnitude, magnitude) * db
        return tl.reshape(v, (BLOCK_N, BLOCK_K)).to(tl.bfloat16)


@triton.jit(do_not_specialize=["M"])  # one compile for every batch size (CUDA graphs capture many)
def _linear_tiles(
    x_ptr, w_ptr, s_ptr, grid_ptr, sign_ptr, col_scale_ptr, token_scale_ptr, x_group_ptr, bias_ptr, y_ptr,
    M, N, K,
    FMT: tl.constexpr, X_FP8: tl.constexpr, TOKEN_SCALE: tl.constexpr, X_GROUPS: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    # consecutive programs share weight tiles (GROUP_M row tiles per column tile) for L2 reuse
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_ok[:, None] & (offs_k[None, :] < K),
                    other=0.0)  # fmt: skip
        w = _decode(w_ptr, s_ptr, grid_ptr, sign_ptr, offs_n, k0, N, K, FMT, X_FP8, BLOCK_N, BLOCK_K)
        if FMT == FMT_FP8_BLOCK or X_GROUPS:  # scales that change every FP8_BLOCK_SIZE along K (== BLOCK_K)
            scale = tl.full((BLOCK_M, BLOCK_N), 1.0, tl.float32)
            if FMT == FMT_FP8_BLOCK:  # weight_scale_inv expanded per row, [N, ceil(K/128)]
                ws = tl.load(s_ptr + offs_n * tl.cdiv(K, FP8_BLOCK_SIZE) + k0 // FP8_BLOCK_SIZE, mask=offs_n < N,
                             other=0.0)  # fmt: skip
                scale = scale * ws[None, :]
            if X_GROUPS:  # 1×128 activation scales [M, ceil(K/128)]
                xs = tl.load(x_group_ptr + offs_m * tl.cdiv(K, FP8_BLOCK_SIZE) + k0 // FP8_BLOCK_SIZE, mask=m_ok,
                             other=0.0)  # fmt: skip
                scale = scale * xs[:, None]
            acc += tl.dot(x, tl.trans(w)) * scale
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    acc = acc * tl.load(col_scale_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    if TOKEN_SCALE:
        acc = acc * tl.load(token_scale_ptr + offs_m, mask=m_ok, other=0.0)[:, None]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(y_ptrs, acc.to(tl.bfloat16), mask=m_ok[:, None] & (offs_n[None, :] < N))


def linear_tiles(
    fmt: str,
    x,
    weight,
    scales,
    col_scale,
    out,
    *,
    grid_table=None,
    sign_table=None,
    token_scale=None,
    x_group_scale=None,
    bias=None,
    config: dict,
):
    """out[M, N] (bf16, written) = x[M, K] · decode(weight)ᵀ with the scales of the module docstring, run with
    `config` (BLOCK_M, BLOCK_N, GROUP_M, num_warps, num_stages: b12x_core's plan picks it).

    weight: the checkpoint bytes (fp8 tensor for FP8/FP8_BLOCK/MXFP8, uint8 otherwise; GGML blocks [N, K/g, B]);
    scales: the block-scale tensor (uint8 E8M0, fp8 e4m3 for NVFP4, float32 [N, ⌈K/128⌉] for FP8_BLOCK) or None;
    grid_table/sign_table: IQ2 grid (int64 [entries]) and ksigns (uint8 [128]).
    """
    if fmt not in FORMAT_IDS:
        raise ValueError(f"linear_tiles: unknown format {fmt!r}; known {FORMATS}")
    m, k = x.shape
    n = out.shape[1]
    cfg = config
    dummy = col_scale  # any valid pointer for the unused ones
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _linear_tiles[grid](
        x, weight, dummy if scales is None else scales, dummy if grid_table is None else grid_table,
        dummy if sign_table is None else sign_table, col_scale, dummy if token_scale is None else token_scale,
        dummy if x_group_scale is None else x_group_scale, dummy if bias is None else bias, out,
        m, n, k,
        FMT=format_id(fmt), X_FP8=x.element_size() == 1, TOKEN_SCALE=token_scale is not None,
        X_GROUPS=x_group_scale is not None, HAS_BIAS=bias is not None,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=BLOCK_K, GROUP_M=cfg["GROUP_M"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    return out


@triton.jit
def _dequantize_tiles(w_ptr, s_ptr, grid_ptr, sign_ptr, col_scale_ptr, out_ptr, N, K,
                      FMT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    w = _decode(w_ptr, s_ptr, grid_ptr, sign_ptr, offs_n, k0, N, K, FMT, False, BLOCK_N, BLOCK_K).to(tl.float32)
    if FMT == FMT_FP8_BLOCK:
        ws = tl.load(s_ptr + offs_n * tl.cdiv(K, FP8_BLOCK_SIZE) + k0 // FP8_BLOCK_SIZE, mask=offs_n < N, other=0.0)
        w = w * ws[:, None]
    w = w * tl.load(col_scale_ptr + offs_n, mask=offs_n < N, other=0.0)[:, None]
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    tl.store(out_ptr + offs_n[:, None] * K + offs_k[None, :], w.to(tl.bfloat16), mask=mask)


def dequantize_tiles(fmt: str, weight, scales, col_scale, out, *, grid_table=None, sign_table=None):
    """out[N, K] (bf16, written) = decode(weight) · block scales · col_scale[n], each rounded once to bf16:
    the weight a large-M call hands to a dense bf16 GEMM (memory-bound, ~N·K·(2 + packed bytes) of traffic)."""
    if fmt not in FORMAT_IDS:
        raise ValueError(f"dequantize_tiles: unknown format {fmt!r}; known {FORMATS}")
    n, k = out.shape
    dummy = col_scale
    grid = (triton.cdiv(n, 64), triton.cdiv(k, BLOCK_K))
    _dequantize_tiles[grid](
        weight, dummy if scales is None else scales, dummy if grid_table is None else grid_table,
        dummy if sign_table is None else sign_table, col_scale, out, n, k,
        FMT=format_id(fmt), BLOCK_N=64, BLOCK_K=BLOCK_K, num_warps=4,
    )  # fmt: skip
    return out


@triton.jit(do_not_specialize=["TOP_K", "Y_ROWS"])  # one compile for every T
def _moe_tiles(
    x_ptr, sorted_ptr, block_expert_ptr, block_start_ptr, block_rows_ptr, w_ptr, s_ptr, grid_ptr, sign_ptr,
    col_scale_ptr, y_ptr, N, K, TOP_K, ROWS_PER_EXPERT, Y_ROWS, K_SPLIT,
    FMT: tl.constexpr, GATHER: tl.constexpr, ACT: tl.constexpr, UP_FIRST: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One expert's rows (a block of the expert-sorted token slots) × BLOCK_N output columns.

    ACT 0: y = h (fp32 out); 1: y = silu(gate)·up (bf16 out; N is the intermediate size, weight rows
    [gate | up] or [up | gate] per expert); 2: y = relu(h)² (bf16 out). GATHER: x rows are token = slot // TOP_K
    of the sorted slots and y rows the sorted positions (the gate/up GEMM); otherwise x rows are the sorted
    positions and y rows the slots themselves (the down GEMM: the combine then reads a token's k rows in place).

    Program axis 2 takes K_SPLIT columns of K. SPLIT: each split writes its raw float32 sums (gate and up side
    by side for ACT 1) to y [splits, Y_ROWS, N or 2N]; moe_activate / moe_combine add the splits in order."""
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    start = tl.load(block_start_ptr + block)
    rows = tl.load(block_rows_ptr + block)
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < rows
    slot = tl.load(sorted_ptr + start + offs_m, mask=m_ok, other=0)
    if GATHER:
        x_rows = slot // TOP_K
        y_rows = start + offs_m
    else:
        x_rows = start + offs_m
        y_rows = slot
    local_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = local_n < N
    first = expert * ROWS_PER_EXPERT + tl.where(n_ok, local_n, 0)
    total_rows = (expert + 1) * ROWS_PER_EXPERT
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # a multiple of BLOCK_K: the compiler must know it to keep 16-byte (and cp.async) loads along K
    k_lo = tl.multiple_of(tl.program_id(2) * K_SPLIT, BLOCK_K)
    for k0 in range(k_lo, tl.minimum(k_lo + K_SPLIT, K), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + x_rows[:, None] * K + offs_k[None, :], mask=m_ok[:, None] & (offs_k[None, :] < K),
                    other=0.0)  # fmt: skip
        w = _decode(w_ptr, s_ptr, grid_ptr, sign_ptr, first, k0, total_rows, K, FMT, False, BLOCK_N, BLOCK_K)
        acc = tl.dot(x, tl.trans(w), acc)
        if ACT == 1:
            w2 = _decode(w_ptr, s_ptr, grid_ptr, sign_ptr, first + N, k0, total_rows, K, FMT, False, BLOCK_N, BLOCK_K)
            acc2 = tl.dot(x, tl.trans(w2), acc2)
    acc = acc * tl.load(col_scale_ptr + first, mask=n_ok, other=0.0)[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT:
        width = 2 * N if ACT == 1 else N
        row_ptrs = y_ptr + (tl.program_id(2).to(tl.int64) * Y_ROWS + y_rows.to(tl.int64))[:, None] * width
        tl.store(row_ptrs + local_n[None, :], acc, mask=mask)
        if ACT == 1:
            acc2 = acc2 * tl.load(col_scale_ptr + first + N, mask=n_ok, other=0.0)[None, :]
            tl.store(row_ptrs + N + local_n[None, :], acc2, mask=mask)
        return
    out_ptrs = y_ptr + y_rows.to(tl.int64)[:, None] * N + local_n[None, :]
    if ACT == 0:
        tl.store(out_ptrs, acc, mask=mask)
    elif ACT == 1:
        acc2 = acc2 * tl.load(col_scale_ptr + first + N, mask=n_ok, other=0.0)[None, :]
        gate = acc2 if UP_FIRST else acc
        up = acc if UP_FIRST else acc2
        tl.store(out_ptrs, (gate / (1.0 + tl.exp(-gate)) * up).to(tl.bfloat16), mask=mask)
    else:
        relu = tl.maximum(acc, 0.0)
        tl.store(out_ptrs, (relu * relu).to(tl.bfloat16), mask=mask)


MOE_ACT = {"none": 0, "silu": 1, "relu2": 2}


@triton.jit(do_not_specialize=["ROWS", "SPLITS"])
def _moe_activate(part_ptr, y_ptr, ROWS, N, SPLITS, ACT: tl.constexpr, UP_FIRST: tl.constexpr,
                  BLOCK: tl.constexpr):  # fmt: skip
    """The split gate/up GEMM's epilogue: add the splits' float32 sums in order, apply SiLU·up or ReLU²."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    width = 2 * N if ACT == 1 else N
    a = tl.zeros((BLOCK,), dtype=tl.float32)
    b = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLITS):
        row = part_ptr + (s * ROWS + r) * width
        a += tl.load(row + cols, mask=ok, other=0.0)
        if ACT == 1:
            b += tl.load(row + N + cols, mask=ok, other=0.0)
    if ACT == 1:
        gate = b if UP_FIRST else a
        up = a if UP_FIRST else b
        y = gate / (1.0 + tl.exp(-gate)) * up
    else:
        relu = tl.maximum(a, 0.0)
        y = relu * relu
    tl.store(y_ptr + r * N + cols, y.to(tl.bfloat16), mask=ok)


def moe_activate(partials, y, act: str, up_first: bool):
    """partials float32 [splits, rows, 2N (SiLU) or N (ReLU²)] -> y bf16 [rows, N]."""
    splits, rows, _ = partials.shape
    n = y.shape[1]
    _moe_activate[(rows, triton.cdiv(n, 512))](partials, y, rows, n, splits, ACT=MOE_ACT[act], UP_FIRST=up_first,
                                                BLOCK=512, num_warps=4)  # fmt: skip
    return y


@triton.jit(do_not_specialize=["TOP_K", "SPLITS", "SLOTS"])
def _moe_combine(out_ptr, weights_ptr, y_ptr, H, TOP_K, SPLITS, SLOTS, BLOCK_H: tl.constexpr):
    """y[t] = Σ_j weights[t, j] · Σ_s out[s, t·TOP_K + j] in float32, j and s in order (deterministic), to bf16."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in range(TOP_K):
        slot = (t * TOP_K + j).to(tl.int64)
        row = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for s in range(SPLITS):
            row += tl.load(out_ptr + (s * SLOTS + slot) * H + cols, mask=ok, other=0.0)
        acc += tl.load(weights_ptr + slot) * row
    tl.store(y_ptr + t.to(tl.int64) * H + cols, acc.to(tl.bfloat16), mask=ok)


def moe_combine(out, topk_weights, y):
    """out float32 [splits, T·k, H] (slot rows), topk_weights float32 [T, k] -> y bf16 [T, H]."""
    t, k = topk_weights.shape
    splits, slots, h = out.shape
    _moe_combine[(t, triton.cdiv(h, 1024))](out, topk_weights, y, h, k, splits, slots, BLOCK_H=1024, num_warps=4)
    return y


def moe_tiles(fmt: str, x, sorted_slots, block_expert, block_start, block_rows, weight, scales, col_scale, out, *,
              top_k: int, rows_per_expert: int, gather: bool, act: str, up_first: bool = False, grid_table=None,
              sign_table=None, block_m: int, block_n: int, num_warps: int, num_stages: int, k_split: int):  # fmt: skip
    """One grouped expert GEMM over expert-sorted token slots (see _moe_tiles); weight/scales/col_scale are the
    experts' tensors stacked along rows ([E·rows_per_expert, ...]); blocks with expert −1 do nothing, so the
    launch size is fixed (CUDA graphs) while the routing decides the work. The configuration (block_m, block_n,
    num_warps, num_stages) and k_split (a multiple of BLOCK_K; K whole when >= K) come from b12x_core's plan
    (benchmarks/moe_configs.py sweeps them). Split K: out is float32 [splits, rows, 2N (SiLU) or N] of raw sums
    (see _moe_tiles)."""
    k = x.shape[1]
    splits = triton.cdiv(k, k_split)
    split = out.dim() == 3
    if split != (splits > 1) and not (split and act == "none"):
        raise ValueError(f"moe_tiles: out {tuple(out.shape)} does not fit {splits} K splits")
    n = out.shape[-1] // (2 if split and act == "silu" else 1)
    dummy = col_scale
    grid = (block_expert.numel(), triton.cdiv(n, block_n), splits)
    _moe_tiles[grid](
        x, sorted_slots, block_expert, block_start, block_rows, weight, dummy if scales is None else scales,
        dummy if grid_table is None else grid_table, dummy if sign_table is None else sign_table, col_scale, out,
        n, k, top_k, rows_per_expert, out.shape[-2], k_split,
        FMT=format_id(fmt), GATHER=gather, ACT=MOE_ACT[act], UP_FIRST=up_first, SPLIT=split, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=BLOCK_K, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
