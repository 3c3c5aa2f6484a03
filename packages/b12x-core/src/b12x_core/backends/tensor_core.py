"""The tensor-core mixed-input GEMM (b12x_kernels.mma_gemm, csrc/mma_gemm.cuh), Marlin class: the weight repacked
once into lane-ordered 1 KB tiles (b12x_core.mma_layout, lossless), streamed through a per-warp cp.async ring,
decoded in registers straight into bf16 MMA fragments (`mma.sync.m16n8k16`, fp32 accumulation), K split across
CTAs with a deterministic in-order reduction so that a few tokens fill every SM.

Every format; activation modes whose operand bf16 holds exactly (bf16, mxfp8, nvfp4 with its input_scale in the
shard factor, static fp8 with its scale there too). Per-token fp8 scales need the GEMV or cuBLASLt.

Configuration per token count: the token tile (8, 16 or 32 tokens per CTA; larger calls run several tiles) and
the K split whose CTAs fill the GPU in the most even waves (mma_path.default_config, from the kernel's occupancy
on this device).
"""

from __future__ import annotations

import torch

from .. import mma_layout, mma_path, workspace
from . import operands
from .base import Backend, config_ranges, cuda_reason

MODES = ("bf16", "mxfp8", "nvfp4", "fp8_static")
CONSERVATIVE_BLOCKS_PER_SM = 2  # plans worked out without the kernel at hand (previews, CPU machines)


def occupancy_slots(query, fmt: str, mt: int) -> int:
    """CTAs of the tensor-core GEMM (format, token tile of 8·mt) that run at once on the query's device: SMs ×
    CTAs per SM, from the kernel's occupancy where it is at hand, else a conservative guess."""
    blocks = CONSERVATIVE_BLOCKS_PER_SM
    if query.on_cuda and not query.device.kernels:
        import b12x_kernels
        from b12x_formats.kernel_facts import format_id

        blocks = b12x_kernels.mma_blocks_per_sm(format_id(fmt), mt, 1) or blocks
    return query.device.sms * blocks


class TensorCoreGemm(Backend):
    name, op = "tensor_core", "linear"
    reads = ("mma",)
    default_tokens = (1, 32)  # where it beats the GEMV and the tiles on the H200 (docs/performance.md)
    tickets_needed = 1  # split-K tickets the largest configured call takes (configs() raises it per instance)

    @classmethod
    def can_implement(cls, q):
        if q.format not in mma_layout.FORMATS:
            return False, f"has no layout for {q.format}"
        if q.act_mode not in MODES:
            return False, f"needs bf16-exact activations ({', '.join(MODES)}), not {q.act_mode}"
        if q.k % 8:
            return False, f"stages activations in 16-byte pieces: needs K % 8 == 0, K is {q.k}"
        if q.shares_bytes:
            return False, "repacks the weight into its own layout; this op shares another op's bytes (tied head)"
        why = cuda_reason(q)
        if why:
            return False, why
        return True, "tensor-core mixed-input GEMM (weights decoded into bf16 MMA fragments, split K)"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        if weights is None:  # a preview: configurations only
            return
        self.shards = weights.mma  # shared: decode + cuBLAS reads it too where the plan runs both

    def configs(self, lo, hi):
        q = self.query
        chunks = -(-q.k // mma_layout.chunk_k(q.format))
        slots = {mt: occupancy_slots(q, q.format, mt) for mt in mma_path.TOKEN_TILES}

        def config_of(m: int) -> dict:
            c = mma_path.default_config(m, q.n, chunks, slots[mma_path.token_tile(m)])
            return {"tokens": 8 * c.mt, "splits": c.splits}

        ranges = config_ranges(lo, hi, config_of)
        for _, last, config in ranges:  # one ticket per output tile of the largest split call
            if config["splits"] > 1:
                tiles = -(-last // config["tokens"]) * -(-q.n // mma_path.ROWS_PER_CTA)
                self.tickets_needed = max(self.tickets_needed, tiles)
        return ranges

    def reserve(self):
        workspace.reserve_tickets(self.query.device.device, self.tickets_needed)

    def _partials(self, tokens, config) -> list:
        return [((config["splits"] * tokens * self.query.n,), torch.float32)] if config["splits"] > 1 else []

    def scratch_bytes(self, tokens, config):
        q = self.query
        return workspace.nbytes(operands.bf16_specs(q.act_mode, tokens, q.k) + self._partials(tokens, config))

    def run(self, x2, bias, *, config):
        q = self.query
        m = x2.shape[0]
        operand_specs = operands.bf16_specs(q.act_mode, m, q.k)
        carved = workspace.carve(x2.device, operand_specs + self._partials(m, config))
        values = carved[: len(operand_specs)]
        xv, _ = operands.bf16_operands(x2.contiguous(), q.act_mode, self.weights.input_scale, values or None)
        y = torch.empty(m, q.n, dtype=torch.bfloat16, device=x2.device)
        if bias is not None and bias.dtype != torch.bfloat16:
            bias = bias.to(torch.bfloat16)
        tickets = workspace.tickets(x2.device, self.tickets_needed)
        partials = carved[-1] if config["splits"] > 1 else tickets.view(torch.float32)  # unread without splits
        ws = mma_path.MmaWorkspace(partials, tickets)
        mc = mma_path.MmaConfig(config["tokens"] // 8, config["splits"])
        mma_path.run(xv.contiguous(), self.shards, y, bias, mc, ws, torch.cuda.current_stream(x2.device).cuda_stream)
        return y
