"""The Hopper form of the tensor-core GEMM (b12x_kernels.wgmma_gemm, csrc/wgmma_gemm.cu): the same repacked weights
as the mma.sync GEMM (one copy, layout "mma"), decoded in registers as the A operand of warpgroup MMAs (sm_90a),
8–128 tokens per CTA as B through shared memory, K split across CTAs with a deterministic reduction.

FP8, MXFP8, NVFP4, MXFP4 and Q8_0 at tiles of up to 128 tokens; FP8_BLOCK, IQ2_XS and IQ2_XXS, whose per-chunk fp32
factor (block scale, d) is folded into the accumulators from a second set of partial sums, up to 64; bf16-exact
activation modes; compute capability 9.0 only. Late in the registry: the plan picks it only where a measured table
says it is faster.
"""

from __future__ import annotations

import torch

from .. import workspace
from ..tensor_core import configure, gemm, geometry, wgmma
from . import operands
from .base import Backend, config_ranges
from .operands import mma_layout_reason


class TensorCoreWgmma(Backend):
    name, op = "tensor_core_wgmma", "linear"
    reads = ("mma",)

    @classmethod
    def can_implement(cls, q):
        if q.format not in wgmma.LINEAR_FORMATS:
            return False, f"decodes {', '.join(wgmma.LINEAR_FORMATS)}, not {q.format}"
        why = mma_layout_reason(q)
        if why:
            return False, why
        if q.device.capability != wgmma.CAPABILITY:
            return False, f"wgmma is an sm_90a instruction: needs compute capability 9.0, this is {q.device.arch}"
        return True, "Hopper tensor-core GEMM (weights decoded as the warpgroup MMA's register operand, split K)"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.shards = weights.mma
        self.tickets_needed = 1

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        q = query
        chunks = -(-q.k // geometry.chunk_k(q.format))
        measured = geometry.kernels_run(q)
        concurrent_ctas = {
            mt: wgmma.concurrent_ctas(q.format, mt, q.device.sms, measured) for mt in wgmma.token_tiles_of(q.format)
        }

        def config_of(m: int) -> dict:
            share = configure.split_share(q.format, m, q.k)
            c = wgmma.default_config(m, q.n, chunks, concurrent_ctas.get, share=share, fmt=q.format, sms=q.device.sms)
            return c.plan_row()

        return config_ranges(lo, hi, config_of)

    @staticmethod
    def tickets(query, rows) -> int:
        """Split-K tickets the largest call of these plan rows takes: one per output tile of a split call."""
        return geometry.split_tickets(query.n, rows)

    def reserve(self, rows):
        self.tickets_needed = self.tickets(self.query, rows)
        workspace.reserve_tickets(self.query.device.device, self.tickets_needed)

    def _scratch_specs(self, tokens, config) -> list:
        q = self.query
        partials = [((config["splits"] * tokens * q.n,), torch.float32)] if config["splits"] > 1 else []
        return partials + [((wgmma.staged_bytes(q.format, tokens, q.k),), torch.uint8)]

    def scratch_bytes(self, tokens, config):
        q = self.query
        return workspace.nbytes(operands.bf16_specs(q.act_mode, tokens, q.k) + self._scratch_specs(tokens, config))

    def run(self, x2, bias, *, config):
        q = self.query
        m = x2.shape[0]
        operand_specs = operands.bf16_specs(q.act_mode, m, q.k)
        carved = workspace.carve(x2.device, operand_specs + self._scratch_specs(m, config))
        values = carved[: len(operand_specs)]
        xv, _ = operands.bf16_operands(x2.contiguous(), q.act_mode, self.weights.input_scale, values or None)
        y = torch.empty(m, q.n, dtype=torch.bfloat16, device=x2.device)
        if bias is not None and bias.dtype != torch.bfloat16:
            bias = bias.to(torch.bfloat16)
        tickets = workspace.tickets(x2.device, self.tickets_needed)
        staged = carved[-1]
        partials = carved[len(operand_specs)] if config["splits"] > 1 else tickets.view(torch.float32)
        mc = gemm.MmaConfig.of_plan_row(config)
        stream = torch.cuda.current_stream(x2.device).cuda_stream
        wgmma.run(xv.contiguous(), self.shards, y, bias, mc, gemm.MmaWorkspace(partials, tickets), staged, stream)
        return y
