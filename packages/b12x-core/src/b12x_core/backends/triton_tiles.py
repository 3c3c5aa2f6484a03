"""The Triton tensor-core tiles (b12x_kernels.tiles.linear_tiles) for every format × activation mode: weights
decoded to bf16 (or kept fp8 for W8A8) in registers, fp32 accumulation, per-row and per-token scales in the
epilogue.

Configuration, per token count: 128-row tiles above 64 tokens, smaller below; column tiles narrowed until about
two waves of programs fill the GPU (a 132-SM H200 at M ≤ 64 has only N/128 programs otherwise).
"""

from __future__ import annotations

import torch

from .. import kernels, workspace
from . import operands
from .base import Backend, config_ranges, cuda_reason

WAVES = 2  # narrower column tiles until about this many waves of programs (one program per SM and wave)


def tile_config(m: int, n: int, sms: int) -> dict:
    """Tile sizes for m tokens × n output columns on a GPU of `sms` SMs (one table for every format so far)."""
    block_m = 128 if m > 64 else 64 if m > 32 else 32 if m > 16 else 16
    block_n = 128
    while block_n > 32 and -(-m // block_m) * -(-n // block_n) < WAVES * sms:
        block_n //= 2
    warps = 8 if block_m == 128 and block_n == 128 else 4
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "GROUP_M": 8, "num_warps": warps,
            "num_stages": 3 if block_m * block_n >= 128 * 128 else 4}  # fmt: skip


class TritonTiles(Backend):
    name, op = "triton_tiles", "linear"

    @classmethod
    def can_implement(cls, q):
        family = kernels.interface.LINEAR_TILES
        if q.format not in family.formats or q.act_mode not in family.act_modes:
            return False, f"has no Triton decode of {q.format} × {q.act_mode} (interface.LINEAR_TILES)"
        why = cuda_reason(q, triton=True, kernels=False)
        if why:
            return False, why
        return True, "Triton tensor-core tiles (every format × activation mode)"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.stacked = weights.stacked

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        return config_ranges(lo, hi, lambda m: tile_config(m, query.n, query.device.sms))

    def scratch_bytes(self, tokens, config):
        if self.query.act_mode == "bf16":
            return 0
        if self.query.act_mode in operands.FP8_MODES:
            return workspace.nbytes(operands.fp8_specs(self.query.act_mode, tokens, self.query.k))
        return workspace.nbytes(operands.bf16_specs(self.query.act_mode, tokens, self.query.k))

    def run(self, x2, bias, *, config):
        from ..kernels import tiles

        q, tw = self.query, self.stacked
        x2 = x2.contiguous()
        token_scale = group_scale = None
        if q.act_mode in operands.FP8_MODES:  # the dot runs in fp8 (FP8 / FP8_BLOCK weights)
            xq, token_scale, group_scale = operands.fp8_operands(x2, q.act_mode, self.weights.input_scale)
        else:
            xq, _ = operands.bf16_operands(x2, q.act_mode, self.weights.input_scale)
        y = torch.empty(x2.shape[0], q.n, dtype=torch.bfloat16, device=x2.device)
        tiles.linear_tiles(
            q.format, xq, tw.weight, tw.scales, tw.col_scale, y, grid_table=tw.grid, sign_table=tw.signs,
            token_scale=token_scale, x_group_scale=group_scale, bias=bias, config=config,
        )  # fmt: skip
        return y
