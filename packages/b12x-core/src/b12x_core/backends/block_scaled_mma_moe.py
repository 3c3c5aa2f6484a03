"""The fused MoE on SM12x's block-scaled mma.sync (b12x_kernels.bsmma_mma's grouped form, csrc/bsmma_gemm.cu): the
linear backend's kernel, layout and activation pass (block_scaled_mma.py) driven by the expert-sorted block table
(b12x_core.moe_blocks), for the MoE pairs that have a block-scaled mode (interface.BSMMA.moe_instructions: NVFP4
experts × nvfp4 on .kind::mxf4nvf4, MXFP4 experts × mxfp8 on .kind::mxf8f6f4).

A call, with no host synchronisation (so it captures in a CUDA graph for a given T):
1. routing (torch ops, moe_blocks.block_table_torch): the token slots sorted by expert (a stable sort) and the block
   table of 8·mt-row blocks of one expert each over that order; each sorted row's expert and each slot's sorted row;
2. x's rows gathered into sorted order (bf16), then the activation pass over them (bsmma_quantize: the same bytes as
   quantizing each token once, the pass being per row);
3. gate/up: the grouped GEMM, float32 rows without factors (the activation sees the unrounded product);
4. activation (b12x_kernels.moe_sorted.activate): each row times its expert's row factors (per-tensor weight scale,
   nvfp4's input_scale), SiLU·up or ReLU², bf16, as the reference;
5. the intermediate's activation pass and the down GEMM, float32 rows;
6. combine (moe_sorted.combine): per token its top-k rows in order, each times its expert's row factors and router
   weight, summed in float32 (deterministic), one bf16 rounding.

Each expert's weight is the linear's layout (block_scaled.layout.pack_experts), experts a fixed number of bytes
apart. On compute capability 12.x the plans choose it for these pairs at every token count (first among the MoE
backends; nothing is measured there yet); elsewhere it declines, and its sm_90 build (the instruction's exact model)
runs by name (plan.build(..., only=BlockScaledMmaMoE)). Its first prepare on an SM12x GPU runs the linear's probe of
each instruction it uses.

Configuration: 8-row table blocks (mt 1) while the mean slots per expert are at most 8, else 32 (mt 4).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import workspace
from ..block_scaled import gemm, layout, probe
from ..moe_blocks import block_table_torch, max_blocks
from ..weights import row_factors
from .base import Backend, config_ranges, cuda_reason
from .operands import in_kernel_scale

MOE_PAIRS = layout.FAMILY.moe_instructions
INT32_MAX = 2**31 - 1


def rows13(shape) -> int:
    """Rows of w13 per expert: gate and up (SiLU) or one (ReLU²)."""
    return 2 * shape.intermediate if shape.activation == "silu" else shape.intermediate


def sorted_rows(ids: torch.Tensor, experts: int, rows_per_block: int):
    """-> (order int64 [S]: the slot at each sorted row, row_expert int32 [S], position int64 [S]: each slot's sorted
    row, table int32 [3, blocks]) for S = T·k slots sorted by expert (stable), with no host synchronisation."""
    order, table = block_table_torch(ids, experts, rows_per_block)
    order = order.to(torch.int64)
    row_expert = ids.reshape(-1)[order].to(torch.int32)
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel(), device=ids.device)
    return order, row_expert, position, table


def _pairs() -> str:
    return ", ".join(f"{f} × {a}" for f, a in MOE_PAIRS)


def _expert_bytes(name: str, n: int, k: int) -> int:
    """Bytes of one expert's codes in the layout (the larger of its two tensors)."""
    n16, units = -(-n // layout.TILE_ROWS), layout.units_of(k)
    return n16 * units * 32 * layout.steps(name) * layout.step_bytes(name) // 2


class BlockScaledMmaMoE(Backend):
    name, op = "block_scaled_mma_moe", "moe"
    reads = ("bsmma_experts",)  # its own expert layouts (block_scaled.layout.pack_experts)

    @staticmethod
    def instructions(q) -> tuple[str | None, str | None]:
        """The instructions of the gate/up and the down GEMM (None: the pair has no block-scaled MoE mode)."""
        return MOE_PAIRS.get((q.format, q.act_mode)), MOE_PAIRS.get((q.moe.w2_format, q.moe.act_mode_2))

    @classmethod
    def can_implement(cls, q):
        shape = q.moe
        names = cls.instructions(q)
        for (fmt, mode), name in zip(((q.format, q.act_mode), (shape.w2_format, shape.act_mode_2)), names,
                                     strict=True):  # fmt: skip
            if name is None:
                return False, f"runs {_pairs()}, not {fmt} × {mode}"
        for what, (name, n, k) in {"w13": (names[0], rows13(shape), shape.hidden),
                                   "w2": (names[1], shape.hidden, shape.intermediate)}.items():  # fmt: skip
            if _expert_bytes(name, n, k) > INT32_MAX:
                return False, f"an expert's {what} layout is {_expert_bytes(name, n, k)} bytes, over the int32 stride"
        why = cuda_reason(q, triton=True)  # the activation and combine passes are Triton's
        if why:
            return False, why
        why = layout.sm12x_reason(q)
        if why:
            return False, why
        for name in names:
            why = probe.failed(q.device.device, name)
            if why:
                return False, f"withdrawn in this process: its first-use probe disagreed ({why})"
        kinds = "; ".join(sorted({layout.instruction(n).ptx.split(".kind::")[1] for n in names}))
        return True, f"SM12x block-scaled mma.sync over expert-sorted rows ({kinds})"

    @classmethod
    def prepare(cls, query, weights):
        for name in dict.fromkeys(cls.instructions(query)):
            probe.first_use(query, name)
        return cls(query, weights)

    def __init__(self, query, weights):
        super().__init__(query, weights)
        w13, w2 = weights
        self.names = self.instructions(query)
        self.w13 = w13.shared("bsmma_experts", lambda: self._experts(w13))
        self.w2 = w2.shared("bsmma_experts", lambda: self._experts(w2))

    @staticmethod
    def _experts(w) -> gemm.BsmmaShard:
        """Every expert's layout in one tensor (row factors: weights.row_factors, [E · rows], for the passes)."""
        x_scale = in_kernel_scale(w.act_mode, w.input_scale)
        factors = row_factors(w.shards, w.act_mode, w.input_scale).astype(np.float32)
        return gemm.upload(layout.pack_experts(w.shards, w.act_mode), factors, x_scale, w.device)

    @staticmethod
    def block_rows(query, tokens: int) -> int:
        """Rows of a table block (8·mt): 8 while the mean slots per expert are at most 8, else 32."""
        small, large = (8 * mt for mt in layout.FAMILY.token_tiles)
        return small if tokens * query.moe.top_k <= small * query.moe.experts else large

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        return config_ranges(lo, hi, lambda t: {"tokens": cls.block_rows(query, t)})

    def _specs(self, tokens: int) -> list:
        """Scratch: x's sorted rows and their pass; the gate/up rows (float32); the intermediate and its pass; the
        down rows (float32)."""
        shape = self.query.moe
        slots = tokens * shape.top_k
        return ([((slots, shape.hidden), torch.bfloat16)] + layout.x_specs(self.names[0], slots, shape.hidden)
                + [((slots, rows13(shape)), torch.float32), ((slots, shape.intermediate), torch.bfloat16)]
                + layout.x_specs(self.names[1], slots, shape.intermediate)
                + [((slots, shape.hidden), torch.float32)])  # fmt: skip

    def scratch_bytes(self, tokens, config):
        return workspace.nbytes(self._specs(tokens))

    @staticmethod
    def table_blocks(query, tokens: int, config: dict) -> int:
        """Entries of the block table a call launches over (the most any routing of its slots fills)."""
        return max_blocks(tokens * query.moe.top_k, query.moe.experts, config["tokens"])

    def run(self, x, topk_weights, topk_ids, *, config):
        from ..kernels import moe_sorted

        shape = self.query.moe
        t, k = topk_ids.shape
        rows = config["tokens"]
        xs, xq, xsc, h, inter, iq, isc, out = workspace.carve(x.device, self._specs(t))
        stream = torch.cuda.current_stream(x.device).cuda_stream

        order, row_expert, position, table = sorted_rows(topk_ids, shape.experts, rows)
        torch.index_select(x.contiguous(), 0, order // k, out=xs)
        gemm.quantize(xs, self.w13, [xq, xsc], stream)
        gemm.grouped(self.w13, [xq, xsc], table, h, rows // 8, stream)
        moe_sorted.activate(h, row_expert, self.w13.row_scale, inter, shape.activation, shape.w13_order == "up_gate")
        gemm.quantize(inter, self.w2, [iq, isc], stream)
        gemm.grouped(self.w2, [iq, isc], table, out, rows // 8, stream)
        y = torch.empty(t, shape.hidden, dtype=torch.bfloat16, device=x.device)
        return moe_sorted.combine(out, position, topk_ids.contiguous(), topk_weights.to(torch.float32).contiguous(),
                                  self.w2.row_scale, y)  # fmt: skip
