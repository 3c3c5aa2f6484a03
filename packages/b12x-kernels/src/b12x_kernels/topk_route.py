"""Top-k routing in one launch: softmax over all experts, the top_k largest probabilities (ties → lower expert
id), optional renormalisation. The same as b12x_core.moe.route_topk_reference, which runs softmax, a stable
descending sort, a slice and a division: several torch launches per MoE layer, which at decode time cost more
than the arithmetic.

Faithful ordering: the kernel selects on the probabilities themselves, computed the way torch's softmax computes
them in fp32 (subtract the row max, exp, sum, divide), not on the logits. Distinct logits can round to the same
probability (their differences from the max round equal, or their exps or quotients do); the reference then
ranks them by id, and so does the kernel. Equal logits always give equal probabilities here, so exact ties
always go to the lower id. What can differ: the order of the row sum (the reference's reduction tree is not
the kernel's), which moves a probability by an ulp or so and so can, in principle, turn a near-tie (two
probabilities one ulp apart) into a tie or back; and in the interpreter (CPU tests), numpy's exp against
torch's, each within an ulp or two of exact. No fused multiply-adds can enter: the kernel's arithmetic is
subtractions, sums and IEEE divisions (libdevice's expf places its own).

A row holding NaN or +inf gets NaN probabilities (as torch's softmax); torch's sort ranks NaN above every number,
so the kernel ranks them as +inf: ids 0..k-1, NaN weights.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

MAX_EXPERTS = 4096  # a token's whole row sits in registers
_TILE = 2048  # logits per program: several tokens per program when the experts are few


@triton.jit(do_not_specialize=["T"])  # one compile for every batch size
def _topk_route(logits_ptr, weights_ptr, ids_ptr, T, E, stride_t, stride_e,
                K: tl.constexpr, RENORMALIZE: tl.constexpr, BT: tl.constexpr, EB: tl.constexpr, KB: tl.constexpr,
                LIBDEVICE_EXP: tl.constexpr):  # fmt: skip
    """BT tokens per program. logits [T, E] (any float dtype, any strides) -> weights [T, K] fp32, ids [T, K]
    int32 (contiguous)."""
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    row_ok = rows < T
    rows = tl.minimum(rows, T - 1)  # the last program's spare rows read a real token, never stored
    experts = tl.arange(0, EB)
    valid = experts < E
    ptrs = logits_ptr + rows[:, None].to(tl.int64) * stride_t + experts[None, :].to(tl.int64) * stride_e
    x = tl.load(ptrs, mask=valid[None, :], other=float("-inf")).to(tl.float32)  # padding: exp(-inf - m) = 0
    m = tl.max(x, axis=1)
    d = x - m[:, None]  # correctly rounded, as torch's: equal here means equal there
    if LIBDEVICE_EXP:
        e = libdevice.exp(d)  # expf, what torch's CUDA softmax calls (tl.exp is ex2.approx(d·log2e): ulps off)
    else:
        e = tl.exp(d)  # the interpreter runs no libdevice; numpy's exp
    s = tl.sum(e, axis=1)
    p = tl.math.div_rn(e, s[:, None])  # IEEE division as torch's `/` (Triton's `/` on fp32 is approximate)
    key = tl.where(p != p, float("inf"), p)  # NaN first, as torch.sort
    key = tl.where(valid[None, :], key, -1.0)  # below every probability: padding is never picked
    slots = tl.arange(0, KB)
    weights = tl.zeros((BT, KB), tl.float32)
    ids = tl.zeros((BT, KB), tl.int32)
    for j in tl.static_range(K):
        best = tl.max(key, axis=1)
        pick = tl.min(tl.where(key == best[:, None], experts[None, :], EB), axis=1)  # the lowest id of the best
        chosen = experts[None, :] == pick[:, None]
        w = tl.sum(tl.where(chosen, p, 0.0), axis=1)  # exactly p at the pick (adding zeros)
        weights = tl.where(slots[None, :] == j, w[:, None], weights)
        ids = tl.where(slots[None, :] == j, pick[:, None], ids)
        key = tl.where(chosen, -1.0, key)  # taken
    if RENORMALIZE:
        weights = tl.math.div_rn(weights, tl.sum(weights, axis=1)[:, None])  # padding slots hold 0
    out = rows[:, None] * K + slots[None, :]
    ok = row_ok[:, None] & (slots[None, :] < K)
    tl.store(weights_ptr + out, weights, mask=ok)
    tl.store(ids_ptr + out, ids, mask=ok)


def topk_route(logits, top_k: int, renormalize: bool, weights_out, ids_out) -> None:
    """logits [T, E] (bf16, fp16 or fp32) -> fills weights_out [T, top_k] fp32 and ids_out [T, top_k] int32
    (contiguous). No allocation, no host synchronisation: graph-capturable."""
    t, e = logits.shape
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k={top_k} must be in 1..{e} (the number of experts)")
    if e > MAX_EXPERTS:
        raise ValueError(f"topk_route takes at most {MAX_EXPERTS} experts, got {e}")
    for name, out, dtype in (("weights_out", weights_out, "float32"), ("ids_out", ids_out, "int32")):
        if tuple(out.shape) != (t, top_k) or str(out.dtype) != f"torch.{dtype}" or not out.is_contiguous():
            raise ValueError(f"{name} must be a contiguous {dtype} [{t}, {top_k}], got {out.dtype} {list(out.shape)}")
    if t == 0:
        return
    eb = triton.next_power_of_2(e)
    bt = max(1, _TILE // eb)  # fixed per E, not per T: one compile serves every batch size
    _topk_route[(triton.cdiv(t, bt),)](
        logits, weights_out, ids_out, t, e, logits.stride(0), logits.stride(1),
        K=top_k, RENORMALIZE=bool(renormalize), BT=bt, EB=eb, KB=triton.next_power_of_2(top_k),
        LIBDEVICE_EXP=logits.is_cuda, num_warps=4 if eb <= _TILE else 8,
    )  # fmt: skip
