"""The CUDA fused-MoE path: expert-sorted token slots, two grouped Triton GEMMs (b12x_kernels.tiles.moe_tiles;
the activation fused into the first), and a deterministic combine.

No host synchronisation: the sort, the per-expert counts and the block table are torch ops on the device, and
the launch covers the most blocks any routing can need (⌈T·k / BLOCK_M⌉ + E); blocks past the routing's work
exit at once. So a call captures in a CUDA graph for a given T. The down GEMM writes each slot's row in place;
one combine kernel sums each token's k rows in slot order in float32 (no atomics: repeated calls are
bit-identical).
"""

from __future__ import annotations

import torch

from .tile_path import bf16_valued


def _smem_kb(device: torch.device) -> int:
    """Shared memory per block the device allows, in KB (a CPU device, the interpreter: the SM12x budget)."""
    if device.type != "cuda":
        return 99
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin // 1024


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
    """One token count per configuration a call up to max_tokens can pick (warm compiles each)."""
    from b12x_kernels import tiles

    smem = _smem_kb(p.device)
    seen, counts = set(), []
    for tokens in range(1, p.max_tokens + 1):
        key = tuple(sorted(tiles.moe_config(tokens * p.top_k / p.experts, p.activation, smem).items()))
        if key not in seen:
            seen.add(key)
            counts.append(tokens)
    return counts


def block_table(ids: torch.Tensor, experts: int, rows_per_block: int):
    """-> (sorted slot indices int32 [T·k], block expert int32 (−1: idle), block start, block rows), on device."""
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


def scratch_specs(p, tokens: int) -> list:
    """The temporaries of a call with `tokens` tokens: quantized x, intermediate (and its quantized copy),
    per-slot outputs in float32."""
    slots = tokens * p.top_k
    return [((tokens, p.hidden), torch.bfloat16), ((slots, p.intermediate), torch.bfloat16),
            ((slots, p.intermediate), torch.bfloat16), ((slots, p.hidden), torch.float32)]  # fmt: skip


def moe_tiles(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, p) -> torch.Tensor:
    from b12x_kernels import tiles

    from . import scratch

    t, k = topk_ids.shape
    first, second = configs(p, t)
    order, block_expert, start, rows = block_table(topk_ids, p.experts, first["block_m"])
    x_q, inter, inter_q, out = scratch.carve(x.device, scratch_specs(p, t))
    w13 = p.tiles13
    tiles.moe_tiles(
        p.w13_format, bf16_valued(x.contiguous(), p.act_mode_13, p.input_scale_13, x_q), order, block_expert, start,
        rows,
        w13.weight, w13.scales, w13.col_scale, inter, rows_per_expert=w13.weight.shape[0] // p.experts, gather=True,
        act=p.activation, up_first=p.w13_order == "up_gate", grid_table=w13.grid, sign_table=w13.signs, top_k=k,
        **first,
    )  # fmt: skip
    w2 = p.tiles2
    tiles.moe_tiles(
        p.w2_format, bf16_valued(inter, p.act_mode_2, p.input_scale_2, inter_q), order, block_expert, start, rows,
        w2.weight,
        w2.scales, w2.col_scale, out, rows_per_expert=p.hidden, gather=False, act="none", grid_table=w2.grid,
        sign_table=w2.signs, top_k=k, **second,
    )  # fmt: skip
    y = torch.empty(t, p.hidden, dtype=torch.bfloat16, device=x.device)
    return tiles.moe_combine(out, topk_weights.to(torch.float32).contiguous(), y)


def reserve_scratch(p) -> None:
    from . import scratch

    scratch.reserve(p.device, scratch.nbytes(scratch_specs(p, p.max_tokens)))


def warm(p) -> None:
    """Reserve the scratch for max_tokens and compile every configuration's kernels at prepare time (routing
    every slot to expert 0)."""
    reserve_scratch(p)
    for tokens in regime_tokens(p):
        ids = torch.zeros(tokens, p.top_k, dtype=torch.int32, device=p.device)
        weights = torch.full((tokens, p.top_k), 1.0 / p.top_k, device=p.device)
        moe_tiles(torch.zeros(tokens, p.hidden, dtype=torch.bfloat16, device=p.device), weights, ids, p)
