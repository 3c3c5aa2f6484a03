"""The fused MoE's routing block table, shared by both MoE backends (Triton's grouped tiles and the tensor-core
GEMM's grouped form) and read by their kernels: token slots sorted by expert, cut into blocks of one expert each.

A table for S = T·k slots has at most (S + U·(R − 1)) / R blocks with work (`max_blocks`: R rows a block, U ≤
min(E, S) experts touched, each one's last block perhaps partial), so a launch over that many blocks covers any
routing with no host synchronisation; blocks past the routing's work have expert −1 and exit at once. (The bound is
the tight one: ⌈S / R⌉ + E, which it replaced, launched 129 blocks for 8 slots over 128 experts, 121 of them idle
CTAs in every column and K split of both GEMMs at one token.) The table is one int32 [3, blocks] tensor (rows: the
block's expert, its first sorted position, its slot count), so a kernel reads it from one pointer. It is made on the
device by one Triton launch (b12x_kernels.moe_route, up to its MAX_SLOTS slots) or by torch ops (a parallel sort,
any size): the same table either way.
"""

from __future__ import annotations

import os

import torch


def decode_kernels() -> bool:
    """B12X_MOE_DECODE_KERNELS=0 turns off the routing kernel and split-K (read at plan construction)."""
    return os.environ.get("B12X_MOE_DECODE_KERNELS", "1") != "0"


def table_maker(slots: int, decode: bool) -> str:
    """Who makes the block table of a call routing `slots` token slots: "kernel" (one Triton launch, up to
    moe_route.MAX_SLOTS slots, unless `decode` is off) or "torch"."""
    from .kernels import moe_route

    return "kernel" if decode and slots <= moe_route.MAX_SLOTS else "torch"


def max_blocks(slots: int, experts: int, rows_per_block: int) -> int:
    """The most blocks with work any routing of `slots` token slots over `experts` experts fills, R = rows_per_block
    rows each: Σ ⌈n_e / R⌉ over the touched experts (n_e ≥ 1, Σ n_e = slots, at most min(experts, slots) of them) is at
    most (slots + touched·(R − 1)) / R, and some routing reaches it (every touched expert one slot past a multiple of
    R) wherever the slots allow."""
    touched = min(experts, slots)
    return max(1, (slots + touched * (rows_per_block - 1)) // rows_per_block)


def block_table(ids: torch.Tensor, experts: int, rows_per_block: int, route: str = "kernel"):
    """-> (sorted slot indices int32 [T·k], blocks int32 [3, n]: per block its expert (−1: idle), first sorted
    position and slot count), on device: one Triton launch (route "kernel", up to moe_route.MAX_SLOTS slots) or
    torch ops (a parallel sort)."""
    from .kernels import moe_route

    if route == "torch":
        return block_table_torch(ids, experts, rows_per_block)
    most = max_blocks(ids.numel(), experts, rows_per_block)
    order = torch.empty(ids.numel(), dtype=torch.int32, device=ids.device)
    blocks = torch.empty(3, most, dtype=torch.int32, device=ids.device)
    moe_route.moe_route(ids.contiguous(), experts, rows_per_block, order, *blocks.unbind(0))
    return order, blocks


def block_table_torch(ids: torch.Tensor, experts: int, rows_per_block: int):
    """block_table in torch ops (any size)."""
    flat = ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would synchronise to size its output
    blocks = (counts + rows_per_block - 1) // rows_per_block
    block_end = torch.cumsum(blocks, 0)
    most = max_blocks(flat.numel(), experts, rows_per_block)
    b = torch.arange(most, device=ids.device)
    expert = torch.searchsorted(block_end, b, right=True)
    valid = expert < experts
    e = expert.clamp(max=experts - 1)
    local = b - (block_end - blocks)[e]
    start = (torch.cumsum(counts, 0) - counts)[e] + local * rows_per_block
    rows = (counts[e] - local * rows_per_block).clamp(0, rows_per_block)
    block_expert = torch.where(valid, e, torch.full_like(e, -1))
    return order.to(torch.int32), torch.stack([block_expert, start, rows]).to(torch.int32)
