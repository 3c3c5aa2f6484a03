"""The tensor-core mixed-input GEMM (b12x_kernels.mma_gemm, csrc/mma_gemm.cuh), Marlin class: the weight repacked
once into lane-ordered 1 KB tiles (b12x_core.tensor_core.layout, lossless), streamed through a per-warp cp.async ring,
decoded in registers straight into bf16 MMA fragments (`mma.sync.m16n8k16`, fp32 accumulation), K split across
CTAs with a deterministic in-order reduction so that a few tokens fill every SM.

Every format; activation modes whose operand bf16 holds exactly (bf16, mxfp8, nvfp4 with its input_scale in the
shard factor, static fp8 with its scale there too). Per-token fp8 scales need the GEMV or cuBLASLt.

Configuration per token count (tensor_core.configure.linear_rule, the family's rules in one module): the token tile
(8, 16 or 32 tokens per CTA; larger calls run several tiles) and the K split whose CTAs fill the GPU in the most even
waves, from the kernel's occupancy on this device; at one token (FP8 and MXFP8: up to 8), activations held whole in
shared memory, and there quantized by the kernel itself for the quantized modes it pairs with (the plan row's
`x_quant`).
"""

from __future__ import annotations

import torch

from .. import workspace
from ..tensor_core import configure, gemm, geometry, layout
from . import operands
from .base import Backend, config_ranges
from .operands import mma_layout_reason


class TensorCoreGemm(Backend):
    name, op = "tensor_core", "linear"
    reads = ("mma",)
    default_tokens = (1, 32)  # where it beats the GEMV and the tiles on the H200 (docs/performance.md)

    @classmethod
    def can_implement(cls, q):
        if q.format not in layout.FORMATS:
            return False, f"has no layout for {q.format}"
        why = mma_layout_reason(q) or geometry.smem_reason(q, q.format, geometry.CTA_HEIGHTS[-1])
        if why:
            return False, why
        return True, "tensor-core mixed-input GEMM (weights decoded into bf16 MMA fragments, split K)"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.shards = weights.mma  # shared: dequantize + cuBLAS reads it too where the plan runs both
        self.tickets_needed = 1  # split-K tickets of the largest call its plan rows make (reserve)

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        return config_ranges(lo, hi, configure.linear_rule(query))

    @staticmethod
    def tickets(query, rows) -> int:
        """Split-K tickets the largest call of these plan rows takes: one per output tile of a split call."""
        return geometry.split_tickets(query.n, rows)

    def reserve(self, rows):
        self.tickets_needed = self.tickets(self.query, rows)
        workspace.reserve_tickets(self.query.device.device, self.tickets_needed)

    def _partials(self, tokens, config) -> list:
        return [((config["splits"] * tokens * self.query.n,), torch.float32)] if config["splits"] > 1 else []

    def _operand_specs(self, tokens, config) -> list:
        """The operand pass's buffers, none where the kernel quantizes the activations itself (the row's x_quant)."""
        return [] if "x_quant" in config else operands.bf16_specs(self.query.act_mode, tokens, self.query.k)

    def scratch_bytes(self, tokens, config):
        return workspace.nbytes(self._operand_specs(tokens, config) + self._partials(tokens, config))

    def run(self, x2, bias, *, config):
        q = self.query
        m = x2.shape[0]
        mc = gemm.MmaConfig.of_plan_row(config)
        x_quant = config.get("x_quant", "none")  # the plan's: the kernel quantizes the rows it holds (configs)
        operand_specs = self._operand_specs(m, config)
        carved = workspace.carve(x2.device, operand_specs + self._partials(m, config))
        values = carved[: len(operand_specs)]
        if x_quant != "none":
            xv = x2
        else:
            xv, _ = operands.bf16_operands(x2.contiguous(), q.act_mode, self.weights.input_scale, values or None)
        y = torch.empty(m, q.n, dtype=torch.bfloat16, device=x2.device)
        if bias is not None and bias.dtype != torch.bfloat16:
            bias = bias.to(torch.bfloat16)
        tickets = workspace.tickets(x2.device, self.tickets_needed)
        partials = carved[-1] if config["splits"] > 1 else tickets.view(torch.float32)  # unread without splits
        ws = gemm.MmaWorkspace(partials, tickets)
        scale = operands.in_kernel_scale(x_quant, self.weights.input_scale)
        stream = torch.cuda.current_stream(x2.device).cuda_stream
        gemm.run(xv.contiguous(), self.shards, y, bias, mc, ws, stream, x_quant=x_quant, x_quant_scale=scale)
        return y
