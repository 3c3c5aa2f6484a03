"""The CUDA fused-MoE path: expert-sorted token slots, two grouped Triton GEMMs (b12x_kernels.tiles.moe_tiles;
the activation fused into the first), and a deterministic combine.

No host synchronisation: the sort, the per-expert counts and the block table are torch ops on the device, and
the launch covers the most blocks any routing can need (⌈T·k / BLOCK_M⌉ + E); blocks past the routing's work
exit at once. So a call captures in a CUDA graph for a given T. The down GEMM writes each slot's row in place;
one combine kernel sums each token's k rows in slot order in float32 (no atomics: repeated calls are
bit-identical).
"""

from __future__ import annotations

import functools
import os

import torch

from .tile_path import bf16_valued


def decode_kernels() -> bool:
    """B12X_MOE_DECODE_KERNELS=0 turns off the routing kernel and split-K (an escape hatch: torch ops and whole-K
    GEMMs compute the same result)."""
    return os.environ.get("B12X_MOE_DECODE_KERNELS", "1") != "0"


@functools.cache
def _smem_kb(device: torch.device) -> int:
    """Shared memory per block the device allows, in KB (a CPU device, the interpreter: the SM12x budget)."""
    if device.type != "cuda":
        return 99
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin // 1024


@functools.cache
def _sms(device: torch.device) -> int:
    """Streaming multiprocessors (a CPU device, the interpreter: 4, so its tests split K too)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def k_split(p, tokens: int, cfg: dict, n: int, k: int) -> int:
    """Columns of K per split for a GEMM of n output columns over k: decode-sized calls (16-row blocks) touch
    few experts, so a launch of experts × column tiles leaves SMs idle; splitting K gives each SM ~8 programs.
    Prefill keeps K whole (its epilogue fuses the activation)."""
    from b12x_kernels import tiles

    steps = -(-k // tiles.BLOCK_K)
    if cfg["block_m"] > 16 or not decode_kernels():
        return steps * tiles.BLOCK_K
    programs = min(tokens * p.top_k, p.experts) * -(-n // cfg["block_n"])
    want = min(steps, max(1, -(-8 * _sms(p.device) // programs)))
    return -(-steps // want) * tiles.BLOCK_K


def configs(p, tokens: int) -> tuple[dict, dict]:
    """Tile configurations of the gate/up and down GEMMs for a call of `tokens` tokens (one block_m: they
    share the block table)."""
    from b12x_kernels import tiles

    per_expert = tokens * p.top_k / p.experts
    smem = _smem_kb(p.device)
    first = tiles.moe_config(per_expert, p.activation, smem)
    second = tiles.moe_config(per_expert, "none", smem)
    return first, second


def regime_tokens(p) -> list[int]:
    """One token count per set of kernels a call up to max_tokens can launch: tile configuration, and whether
    the gate/up GEMM splits K (another kernel variant, plus the split epilogue). warm compiles each."""
    seen, counts = set(), []
    for tokens in range(1, p.max_tokens + 1):
        key = (str(configs(p, tokens)), splits(p, tokens)[1] > 1)
        if key not in seen:
            seen.add(key)
            counts.append(tokens)
    return counts


def block_table(ids: torch.Tensor, experts: int, rows_per_block: int):
    """-> (sorted slot indices int32 [T·k], block expert int32 (−1: idle), block start, block rows), on device:
    one Triton launch for decode-sized calls, torch ops (a parallel sort) past MAX_SLOTS."""
    from b12x_kernels import moe_route

    if ids.numel() > moe_route.MAX_SLOTS or not decode_kernels():
        return block_table_torch(ids, experts, rows_per_block)
    most = -(-ids.numel() // rows_per_block) + experts
    order = torch.empty(ids.numel(), dtype=torch.int32, device=ids.device)
    block_expert, start, rows = torch.empty(3, most, dtype=torch.int32, device=ids.device).unbind(0)
    moe_route.moe_route(ids.contiguous(), experts, rows_per_block, order, block_expert, start, rows)
    return order, block_expert, start, rows


def block_table_torch(ids: torch.Tensor, experts: int, rows_per_block: int):
    """block_table in torch ops (any size)."""
    flat = ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would synchronise to size its output
    blocks = (counts + rows_per_block - 1) // rows_per_block
    block_end = torch.cumsum(blocks, 0)
    most = -(-flat.numel() // rows_per_block) + experts
    b = torch.arange(most, device=ids.device)
    expert = torch.searchsorted(block_end, b, right=True)
    valid = expert < experts
    e = expert.clamp(max=experts - 1)
    local = b - (block_end - blocks)[e]
    start = (torch.cumsum(counts, 0) - counts)[e] + local * rows_per_block
    rows = (counts[e] - local * rows_per_block).clamp(0, rows_per_block)
    block_expert = torch.where(valid, e, torch.full_like(e, -1))
    return order.to(torch.int32), block_expert.to(torch.int32), start.to(torch.int32), rows.to(torch.int32)


def splits(p, tokens: int, cfgs: tuple[dict, dict] | None = None) -> tuple[int, int, int, int]:
    """-> (K columns per split, splits) of the gate/up GEMM, then of the down GEMM, for `tokens` tokens
    (`cfgs`: configs(p, tokens) where the caller has them)."""
    first, second = cfgs or configs(p, tokens)
    split13 = k_split(p, tokens, first, p.intermediate, p.hidden)
    split2 = k_split(p, tokens, second, p.hidden, p.intermediate)
    return split13, -(-p.hidden // split13), split2, -(-p.intermediate // split2)


def scratch_specs(p, tokens: int, split: tuple[int, int, int, int] | None = None) -> list:
    """The temporaries of a call with `tokens` tokens: quantized x, the gate/up GEMM's float32 split sums
    (none when K is whole), the intermediate and its quantized copy, the down GEMM's float32 slot rows per split
    (`split`: splits(p, tokens) where the caller has it)."""
    slots = tokens * p.top_k
    _, splits13, _, splits2 = split or splits(p, tokens)
    width13 = 2 * p.intermediate if p.activation == "silu" else p.intermediate
    return [((tokens, p.hidden), torch.bfloat16), ((splits13 if splits13 > 1 else 0, slots, width13), torch.float32),
            ((slots, p.intermediate), torch.bfloat16), ((slots, p.intermediate), torch.bfloat16),
            ((splits2, slots, p.hidden), torch.float32)]  # fmt: skip


def moe_tiles(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, p) -> torch.Tensor:
    from b12x_kernels import tiles

    from . import scratch

    t, k = topk_ids.shape
    first, second = cfgs = configs(p, t)
    split = splits(p, t, cfgs)
    split13, splits13, split2, _ = split
    order, block_expert, start, rows = block_table(topk_ids, p.experts, first["block_m"])
    x_q, partial13, inter, inter_q, out = scratch.carve(x.device, scratch_specs(p, t, split))
    w13 = p.tiles13
    up_first = p.w13_order == "up_gate"
    tiles.moe_tiles(
        p.w13_format, bf16_valued(x.contiguous(), p.act_mode_13, p.input_scale_13, x_q), order, block_expert, start,
        rows, w13.weight, w13.scales, w13.col_scale, partial13 if splits13 > 1 else inter,
        rows_per_expert=w13.weight.shape[0] // p.experts, gather=True, act=p.activation, up_first=up_first,
        grid_table=w13.grid, sign_table=w13.signs, top_k=k, k_split=split13, **first,
    )  # fmt: skip
    if splits13 > 1:
        tiles.moe_activate(partial13, inter, p.activation, up_first)
    w2 = p.tiles2
    tiles.moe_tiles(
        p.w2_format, bf16_valued(inter, p.act_mode_2, p.input_scale_2, inter_q), order, block_expert, start, rows,
        w2.weight,
        w2.scales, w2.col_scale, out, rows_per_expert=p.hidden, gather=False, act="none", grid_table=w2.grid,
        sign_table=w2.signs, top_k=k, k_split=split2, **second,
    )  # fmt: skip
    y = torch.empty(t, p.hidden, dtype=torch.bfloat16, device=x.device)
    return tiles.moe_combine(out, topk_weights.to(torch.float32).contiguous(), y)


def reserve_scratch(p) -> None:
    """Enough scratch for any call up to max_tokens (split sums make the need depend on T, not only grow)."""
    from . import scratch

    scratch.reserve(p.device, max(scratch.nbytes(scratch_specs(p, t)) for t in range(1, p.max_tokens + 1)))


def warm(p) -> None:
    """Reserve the scratch for max_tokens and compile every configuration's kernels at prepare time (routing
    every slot to expert 0)."""
    reserve_scratch(p)
    for tokens in regime_tokens(p):
        ids = torch.zeros(tokens, p.top_k, dtype=torch.int32, device=p.device)
        weights = torch.full((tokens, p.top_k), 1.0 / p.top_k, device=p.device)
        moe_tiles(torch.zeros(tokens, p.hidden, dtype=torch.bfloat16, device=p.device), weights, ids, p)
