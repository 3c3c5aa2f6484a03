"""The fused MoE on CUDA: expert-sorted token slots, two grouped Triton GEMMs (b12x_kernels.tiles.moe_tiles; the
activation fused into the first), and a deterministic combine.

No host synchronisation: the sort, the per-expert counts and the block table are made on the device, and the
launch covers the most blocks any routing can need (moe_blocks.max_blocks); blocks past the routing's work exit at
once. So a call captures in a CUDA graph for a given T. The down GEMM writes each slot's row in place; one
combine kernel sums each token's k rows in slot order in float32 (no atomics: repeated calls are bit-identical).

Configuration per token count (chosen here, at plan construction): the tile sizes of both GEMMs (from the mean
rows per expert; measured on the H200 with benchmarks/moe_configs.py), their K splits (decode-sized calls touch
few experts, so splitting K fills the SMs), and the routing table's maker (one Triton launch for decode-sized
calls, torch ops past the kernel's slot limit). `B12X_MOE_DECODE_KERNELS=0`, read when the plan is made, turns
off the routing kernel and split-K: an escape hatch, same results.
"""

from __future__ import annotations

import torch

from .. import kernels, workspace
from ..moe_blocks import block_table, decode_kernels, table_maker
from . import operands
from .base import Backend, DeviceInfo, MoEShape, config_ranges, cuda_reason

SPLIT_PROGRAMS_PER_SM = 8  # split K until each SM has about this many programs


def tile_config(rows_per_expert: float, act: str, smem_kb: int) -> dict:
    """Tile sizes of a grouped GEMM, from the mean rows per expert (measured on the H200; docs/performance.md).
    Decode: 16-row blocks, narrow 32-column tiles (more CTAs stream weights); prefill: 128-row blocks on parts
    with the H200's shared memory. SM12x (99 KB) keeps 64-row blocks until measured there: the 128-row tiles fit
    (64 KB, tests/kernels/compile_targets.py) but leave one block per SM. Two weight tiles (SiLU's gate and up)
    take one pipeline stage fewer."""
    if rows_per_expert <= 8:
        return dict(block_m=16, block_n=32, num_warps=4, num_stages=3 if act == "silu" else 4)
    if rows_per_expert <= 64 or smem_kb < 160:
        return dict(block_m=64, block_n=64, num_warps=4, num_stages=2 if act == "silu" else 3)
    return dict(block_m=128, block_n=64, num_warps=4, num_stages=2)


def k_split(shape: MoEShape, device: DeviceInfo, tokens: int, cfg: dict, n: int, k: int, split_k: bool) -> int:
    """Columns of K per split for a GEMM of n output columns over k: decode-sized calls (16-row blocks) touch
    few experts, so a launch of experts × column tiles leaves SMs idle; splitting K gives each SM about
    SPLIT_PROGRAMS_PER_SM programs. Prefill keeps K whole (its epilogue fuses the activation)."""
    from ..kernels import tiles

    steps = -(-k // tiles.BLOCK_K)
    if cfg["block_m"] > 16 or not split_k:
        return steps * tiles.BLOCK_K
    programs = min(tokens * shape.top_k, shape.experts) * -(-n // cfg["block_n"])
    want = min(steps, max(1, -(-SPLIT_PROGRAMS_PER_SM * device.sms // programs)))
    return -(-steps // want) * tiles.BLOCK_K


def call_config(shape: MoEShape, device: DeviceInfo, tokens: int, decode: bool = True) -> dict:
    """Everything a call of `tokens` tokens runs with: both GEMMs' tiles (one block_m: they share the block
    table), their K splits, and the routing table's maker (`decode`: B12X_MOE_DECODE_KERNELS)."""
    per_expert = tokens * shape.top_k / shape.experts
    first = tile_config(per_expert, shape.activation, device.smem_kb)
    second = tile_config(per_expert, "none", device.smem_kb)
    split13 = k_split(shape, device, tokens, first, shape.intermediate, shape.hidden, decode)
    split2 = k_split(shape, device, tokens, second, shape.hidden, shape.intermediate, decode)
    route = table_maker(tokens * shape.top_k, decode)
    return {"gate_up": first, "down": second, "k_split": (split13, split2), "route": route}


def splits(shape: MoEShape, config: dict) -> tuple[int, int]:
    split13, split2 = config["k_split"]
    return -(-shape.hidden // split13), -(-shape.intermediate // split2)


def scratch_specs(shape: MoEShape, tokens: int, config: dict) -> list:
    """The temporaries of a call: quantized x, the gate/up GEMM's float32 split sums (none when K is whole), the
    intermediate and its quantized copy, the down GEMM's float32 slot rows per split."""
    slots = tokens * shape.top_k
    splits13, splits2 = splits(shape, config)
    width13 = 2 * shape.intermediate if shape.activation == "silu" else shape.intermediate
    partial13 = (splits13 if splits13 > 1 else 0, slots, width13)
    return [((tokens, shape.hidden), torch.bfloat16), (partial13, torch.float32),
            ((slots, shape.intermediate), torch.bfloat16), ((slots, shape.intermediate), torch.bfloat16),
            ((splits2, slots, shape.hidden), torch.float32)]  # fmt: skip


class TritonMoE(Backend):
    name, op = "triton_moe", "moe"

    @classmethod
    def can_implement(cls, q):
        family = kernels.interface.MOE_TILES
        for fmt, mode in ((q.format, q.act_mode), (q.moe.w2_format, q.moe.act_mode_2)):
            if fmt not in family.formats or mode not in family.act_modes:
                return False, f"has no Triton decode of {fmt} × {mode} (interface.MOE_TILES)"
        why = cuda_reason(q, triton=True, kernels=False)
        if why:
            return False, why
        return True, "Triton grouped expert GEMMs over expert-sorted slots, activation fused"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        w13, w2 = weights
        self.w13, self.w2 = w13.stacked, w2.stacked  # experts stacked by rows
        self.input_scales = (w13.input_scale, w2.input_scale)

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        decode = decode_kernels()
        return config_ranges(lo, hi, lambda t: call_config(query.moe, query.device, t, decode))

    def scratch_bytes(self, tokens, config):
        return workspace.nbytes(scratch_specs(self.query.moe, tokens, config))

    def run(self, x, topk_weights, topk_ids, *, config):
        from ..kernels import tiles

        q, shape = self.query, self.query.moe
        t, k = topk_ids.shape
        first, second = config["gate_up"], config["down"]
        split13, split2 = config["k_split"]
        splits13, _ = splits(shape, config)
        order, blocks = block_table(topk_ids, shape.experts, first["block_m"], config["route"])
        block_expert, start, rows = blocks.unbind(0)
        x_q, partial13, inter, inter_q, out = workspace.carve(x.device, scratch_specs(shape, t, config))
        s13, s2 = self.input_scales
        up_first = shape.w13_order == "up_gate"
        w13 = self.w13
        x_in, _ = operands.bf16_operands(x.contiguous(), q.act_mode, s13, [x_q])
        tiles.moe_tiles(
            q.format, x_in, order, block_expert, start, rows, w13.weight, w13.scales, w13.col_scale,
            partial13 if splits13 > 1 else inter, rows_per_expert=w13.weight.shape[0] // shape.experts, gather=True,
            act=shape.activation, up_first=up_first, grid_table=w13.grid, sign_table=w13.signs, top_k=k,
            k_split=split13, **first,
        )  # fmt: skip
        if splits13 > 1:
            tiles.moe_activate(partial13, inter, shape.activation, up_first)
        w2 = self.w2
        inter_in, _ = operands.bf16_operands(inter, shape.act_mode_2, s2, [inter_q])
        tiles.moe_tiles(
            shape.w2_format, inter_in, order, block_expert, start, rows, w2.weight, w2.scales, w2.col_scale, out,
            rows_per_expert=shape.hidden, gather=False, act="none", grid_table=w2.grid, sign_table=w2.signs, top_k=k,
            k_split=split2, **second,
        )  # fmt: skip
        y = torch.empty(t, shape.hidden, dtype=torch.bfloat16, device=x.device)
        return tiles.moe_combine(out, topk_weights.to(torch.float32).contiguous(), y)
