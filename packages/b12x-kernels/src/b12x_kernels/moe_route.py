"""The fused MoE's routing tables in one launch: token slots sorted by expert (stable), and the block table the
grouped GEMMs walk. For decode-sized calls, where the ~30 small torch ops that compute the same tables
(b12x_core.backends.triton_moe) cost more than the expert GEMMs themselves."""

from __future__ import annotations

import triton
import triton.language as tl

MAX_SLOTS = 1024  # one program walks the slots in chunks; past this the torch ops' parallel sort is faster
_CHUNK = 32


@triton.jit(do_not_specialize=["SLOTS", "MOST", "BM"])  # one compile for every T
def _moe_route(ids_ptr, order_ptr, block_expert_ptr, block_start_ptr, block_rows_ptr, SLOTS, E, MOST, BM,
               EB: tl.constexpr, CH: tl.constexpr):  # fmt: skip
    """One program. ids [SLOTS] -> order [SLOTS] (slot at each sorted position) and, per block b < MOST, its
    expert (−1: idle), first sorted position and row count (as b12x_core.moe_blocks.block_table)."""
    experts = tl.arange(0, EB)
    counts = tl.zeros((EB,), tl.int32)
    for c0 in range(0, SLOTS, CH):
        s = c0 + tl.arange(0, CH)
        e = tl.load(ids_ptr + s, mask=s < SLOTS, other=-1).to(tl.int32)
        counts += tl.sum((e[:, None] == experts[None, :]).to(tl.int32), axis=0)
    starts = tl.cumsum(counts, axis=0) - counts  # each expert's first sorted position
    blocks = (counts + BM - 1) // BM
    block_end = tl.cumsum(blocks, axis=0)
    seen = tl.zeros((EB,), tl.int32)  # slots of each expert placed by earlier chunks
    for c0 in range(0, SLOTS, CH):
        s = c0 + tl.arange(0, CH)
        ok = s < SLOTS
        e = tl.load(ids_ptr + s, mask=ok, other=-1).to(tl.int32)
        hot = (e[:, None] == experts[None, :]).to(tl.int32)
        earlier = tl.cumsum(hot, axis=0) - hot  # same-expert slots earlier in this chunk: a stable order
        pos = tl.sum(hot * ((starts + seen)[None, :] + earlier), axis=1)
        tl.store(order_ptr + pos, s, mask=ok)
        seen += tl.sum(hot, axis=0)
    for b0 in range(0, MOST, CH):
        b = b0 + tl.arange(0, CH)
        expert = tl.sum((block_end[None, :] <= b[:, None]).to(tl.int32), axis=1)  # ≥ E: past the work
        hot = (expert[:, None] == experts[None, :]).to(tl.int32)
        local = b - tl.sum(hot * (block_end - blocks)[None, :], axis=1)
        rows = tl.sum(hot * counts[None, :], axis=1) - local * BM
        ok = b < MOST
        tl.store(block_expert_ptr + b, tl.where(expert < E, expert, -1), mask=ok)
        tl.store(block_start_ptr + b, tl.sum(hot * starts[None, :], axis=1) + local * BM, mask=ok)
        tl.store(block_rows_ptr + b, tl.minimum(tl.maximum(rows, 0), BM), mask=ok)


def moe_route(ids, experts: int, rows_per_block: int, order, block_expert, block_start, block_rows):
    """ids [T, k] (any integer dtype) -> fills order [T·k] and the block table (int32 each, MOST entries)."""
    slots = ids.numel()
    if slots > MAX_SLOTS:
        raise ValueError(f"moe_route takes at most {MAX_SLOTS} slots, got {slots}")
    _moe_route[(1,)](
        ids, order, block_expert, block_start, block_rows, slots, experts, block_expert.numel(), rows_per_block,
        EB=triton.next_power_of_2(experts), CH=_CHUNK, num_warps=4,
    )  # fmt: skip
