"""The passes around a fused MoE whose GEMMs read and write expert-sorted rows (the grouped CUTLASS GEMM,
csrc/sm90_moe.h): the activation of the gate/up GEMM's rows, each times its expert's row factors, and the combine of
the down GEMM's rows back to tokens. Sorted row p holds token slot order[p] (slot s = token · top_k + j); the GEMMs
leave the per-row factors (per-tensor weight scales, a left-out activation scale) to these passes."""

from __future__ import annotations

import triton
import triton.language as tl

ACTS = {"silu": 1, "relu2": 2}


@triton.jit(do_not_specialize=["N", "INTER"])
def _activate(h_ptr, expert_ptr, factor_ptr, y_ptr, N, INTER, ACT: tl.constexpr, UP_FIRST: tl.constexpr,
              BLOCK: tl.constexpr):  # fmt: skip
    """y[p, i] = silu(gate) · up or relu(v)² of v = h[p, :] · factor[e, :], e = expert[p], in float32, to bf16.
    SiLU: N = 2·INTER, gate and up the halves in w13's order."""
    p = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < INTER
    e = tl.load(expert_ptr + p).to(tl.int64)
    row, factors = h_ptr + p * N, factor_ptr + e * N
    a = tl.load(row + cols, mask=ok, other=0.0) * tl.load(factors + cols, mask=ok, other=0.0)
    if ACT == 1:
        b = tl.load(row + INTER + cols, mask=ok, other=0.0) * tl.load(factors + INTER + cols, mask=ok, other=0.0)
        gate = b if UP_FIRST else a
        up = a if UP_FIRST else b
        y = gate / (1.0 + tl.exp(-gate)) * up
    else:
        relu = tl.maximum(a, 0.0)
        y = relu * relu
    tl.store(y_ptr + p * INTER + cols, y.to(tl.bfloat16), mask=ok)


def activate(h, row_expert, factor, y, act: str, up_first: bool):
    """h float32 [rows, 2I (SiLU) or I (ReLU²)] (sorted rows), row_expert int32 [rows] (each row's expert), factor
    float32 [E · h's width] (each expert's row factors) -> y bf16 [rows, I]."""
    rows, n = h.shape
    inter = y.shape[1]
    if n != (2 * inter if act == "silu" else inter) or y.shape[0] != rows or row_expert.numel() != rows:
        raise ValueError(f"activate: h {tuple(h.shape)}, y {tuple(y.shape)} and row_expert [{row_expert.numel()}] "
                         f"do not fit {act}")  # fmt: skip
    if rows:
        _activate[(rows, triton.cdiv(inter, 512))](h, row_expert, factor, y, n, inter, ACT=ACTS[act],
                                                   UP_FIRST=up_first, BLOCK=512, num_warps=4)  # fmt: skip
    return y


@triton.jit(do_not_specialize=["H", "TOP_K"])
def _combine(out_ptr, position_ptr, ids_ptr, weights_ptr, factor_ptr, y_ptr, H, TOP_K, BLOCK_H: tl.constexpr):
    """y[t] = Σ_j weights[t, j] · factor[e_j, :] · out[position[t·TOP_K + j], :] in float32, j in the token's top-k
    order (deterministic, no atomics), to bf16."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in range(TOP_K):
        slot = (t * TOP_K + j).to(tl.int64)
        p = tl.load(position_ptr + slot).to(tl.int64)
        e = tl.load(ids_ptr + slot).to(tl.int64)
        row = tl.load(out_ptr + p * H + cols, mask=ok, other=0.0).to(tl.float32)
        row = row * tl.load(factor_ptr + e * H + cols, mask=ok, other=0.0)
        acc += tl.load(weights_ptr + slot) * row
    tl.store(y_ptr + t.to(tl.int64) * H + cols, acc.to(tl.bfloat16), mask=ok)


def combine(out, position, ids, topk_weights, factor, y):
    """out bf16 [T·k, H] (sorted rows), position [T·k] (each slot's sorted row), ids [T, k] (any integer dtype),
    topk_weights float32 [T, k], factor float32 [E · H] (each expert's row factors) -> y bf16 [T, H]."""
    t, k = topk_weights.shape
    h = y.shape[1]
    if out.shape != (t * k, h) or position.numel() != t * k or tuple(ids.shape) != (t, k):
        raise ValueError(f"combine: out {tuple(out.shape)}, position [{position.numel()}], ids {tuple(ids.shape)} "
                         f"do not fit {t} tokens × top-{k} and H={h}")  # fmt: skip
    _combine[(t, triton.cdiv(h, 1024))](out, position, ids, topk_weights, factor, y, h, k, BLOCK_H=1024,
                                        num_warps=4)  # fmt: skip
    return y
