"""The fused MoE on the grouped form of the Hopper CUTLASS GEMM (b12x_kernels.sm90_moe_gemm, csrc/sm90_moe_gemm.cuh:
CUTLASS's ptr-array mixed-input collective, one problem per expert, its shapes and pointers written on the device).

A call, with no host synchronisation (so it captures in a CUDA graph for a given T):
1. routing (torch ops): the token slots sorted by expert (a stable sort), each sorted row's expert, each slot's sorted
   row, and the expert offsets [E + 1] the GEMM's problem kernel reads;
2. x quantized per the activation mode (bf16_operands, over the T tokens), then gathered into sorted rows;
3. gate/up GEMM, float32 out (the activation and the intermediate's quantization see the unrounded product);
4. activation (b12x_kernels.moe_sorted.activate): each row times its expert's row factors, SiLU·up or ReLU², bf16;
5. the intermediate quantized per the down GEMM's mode, then the down GEMM, float32 out (a bf16 row rounded before the
   combine would round twice: where a token's top-k rows nearly cancel, that reached 1.1% of the output's rms);
6. combine (moe_sorted.combine): per token, its top-k rows in order, each times its expert's row factors and its router
   weight, summed in float32 (deterministic), one bf16 rounding.

NVFP4 (and W4A16_NVFP4) and MXFP4 experts (interface.SM90_MOE) in the checkpoint's layout, the "checkpoint" copy the
Triton MoE reads too, with the block scales as one carrier per row and 64-deep k-tile ([E, K/64, N, 64/group], a small
copy). Compute capability 9.0 only; N and K of both GEMMs multiples of 64. Last in the registry: a plan picks it only
where the measured MoE table (benchmarks/moe.py) has it faster.
"""

from __future__ import annotations

import torch

from .. import kernels, workspace
from ..kernels import interface
from . import operands
from .base import Backend, cuda_reason, sm90_mixed_reason

FAMILY = interface.SM90_MOE
TILE_K = interface.SM90_MIXED_TILE_K


def rows13(shape) -> int:
    """Rows of w13 per expert: gate and up (SiLU) or one (ReLU²)."""
    return 2 * shape.intermediate if shape.activation == "silu" else shape.intermediate


def expert_tile_scales(block_scales: torch.Tensor, experts: int, k: int) -> torch.Tensor:
    """Block scales of an expert stack [E·N, K/group] (one byte each, as the checkpoint holds them) -> [E, K/64, N,
    64/group]: per expert, one carrier of a row's scales per k-tile, N fastest, as the kernel's TMA reads them."""
    rows, groups = block_scales.shape
    n, per_tile = rows // experts, groups * TILE_K // k
    return block_scales.reshape(experts, n, k // TILE_K, per_tile).permute(0, 2, 1, 3).contiguous()


def sorted_routing(ids: torch.Tensor, experts: int):
    """-> (order int64 [S]: the slot at each sorted row, row_expert int32 [S], position int64 [S]: each slot's sorted
    row, offsets int32 [E + 1]: expert e's rows are [offsets[e], offsets[e + 1])) for S = T·k slots sorted by expert,
    ties in slot order. Torch ops only (no host synchronisation)."""
    flat = ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)
    row_expert = flat[order].to(torch.int32)
    position = torch.empty_like(order)
    position[order] = torch.arange(flat.numel(), device=ids.device)
    counts = torch.zeros(experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would synchronise to size its output
    offsets = torch.zeros(experts + 1, dtype=torch.int32, device=ids.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return order, row_expert, position, offsets


class CutlassSm90MoE(Backend):
    name, op = "cutlass_sm90_moe", "moe"
    reads = ("checkpoint",)  # the experts' checkpoint bytes stacked along N (DeviceWeights.stacked)

    @classmethod
    def can_implement(cls, q):
        shape = q.moe
        for fmt in (q.format, shape.w2_format):
            if fmt not in FAMILY.formats:
                return False, f"converts {', '.join(FAMILY.formats)}, not {fmt}"
        for mode in (q.act_mode, shape.act_mode_2):
            if mode not in FAMILY.act_modes:
                return False, f"needs bf16-exact activations ({', '.join(FAMILY.act_modes)}), not {mode}"
        dims = {"w13 rows per expert": rows13(shape), "H": shape.hidden, "I": shape.intermediate}
        for what, size in dims.items():
            if size % TILE_K:
                return False, f"needs whole {TILE_K}-row and {TILE_K}-deep tiles: {what} % {TILE_K} == 0, is {size}"
        why = cuda_reason(q, triton=True)
        if why:
            return False, why
        why = sm90_mixed_reason(q)
        if why:
            return False, why
        return True, "CUTLASS SM90 grouped mixed-input GEMMs over expert-sorted rows (one problem per expert)"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        shape = query.moe
        w13, w2 = weights
        self.w13, self.w2 = w13.stacked, w2.stacked
        self.scales13 = w13.shared("sm90_moe_scales", lambda: self._carriers(self.w13, shape.hidden))
        self.scales2 = w2.shared("sm90_moe_scales", lambda: self._carriers(self.w2, shape.intermediate))
        self.input_scales = (w13.input_scale, w2.input_scale)

    def _carriers(self, stacked, k: int) -> torch.Tensor:
        return expert_tile_scales(stacked.scales.view(torch.uint8), self.query.moe.experts, k)

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        return [(lo, hi, {"tokens": FAMILY.token_tiles[0]})]  # one kernel: 128 weight rows × 128 tokens a CTA

    def _gemm_bytes(self) -> int:
        """The workspace of either GEMM (they run one after the other on the stream and share it): the larger."""
        q, shape = self.query, self.query.moe
        w13, w2, sms = interface.SM90_MOE_WEIGHTS[q.format], interface.SM90_MOE_WEIGHTS[shape.w2_format], q.device.sms
        return max(kernels.sm90_moe_workspace_bytes(w13, shape.experts, rows13(shape), shape.hidden, True, sms),
                   kernels.sm90_moe_workspace_bytes(w2, shape.experts, shape.hidden, shape.intermediate, True,
                                                    sms))  # fmt: skip

    def _specs(self, tokens: int) -> list:
        """Scratch: x's operand pass, x's sorted rows, the gate/up GEMM's float32 rows, the intermediate and its
        operand pass, the down GEMM's float32 rows, the GEMMs' workspace."""
        shape = self.query.moe
        slots = tokens * shape.top_k
        return (operands.bf16_specs(self.query.act_mode, tokens, shape.hidden)
                + [((slots, shape.hidden), torch.bfloat16), ((slots, rows13(shape)), torch.float32),
                   ((slots, shape.intermediate), torch.bfloat16)]
                + operands.bf16_specs(shape.act_mode_2, slots, shape.intermediate)
                + [((slots, shape.hidden), torch.float32), ((self._gemm_bytes(),), torch.uint8)])  # fmt: skip

    def scratch_bytes(self, tokens, config):
        return workspace.nbytes(self._specs(tokens))

    def _gemm(self, fmt: str, stacked, scales, n: int, k: int, x, y, offsets, gemm_ws, stream: int) -> None:
        shape = self.query.moe
        kernels.sm90_moe_gemm(
            interface.SM90_MOE_WEIGHTS[fmt], shape.experts, n, k, stacked.weight.data_ptr(), scales.data_ptr(),
            x.data_ptr(), y.data_ptr(), y.dtype == torch.float32, offsets.data_ptr(), self.query.device.sms,
            gemm_ws.data_ptr(), gemm_ws.numel(), stream,
        )  # fmt: skip

    def run(self, x, topk_weights, topk_ids, *, config):
        from ..kernels import moe_sorted

        q, shape = self.query, self.query.moe
        t, k = topk_ids.shape
        carved = workspace.carve(x.device, self._specs(t))
        n_x = len(operands.bf16_specs(q.act_mode, t, shape.hidden))
        x_buffers, (xs, h, inter, *rest) = carved[:n_x], carved[n_x:]
        inter_buffers, (out, gemm_ws) = rest[:-2], rest[-2:]
        stream = torch.cuda.current_stream(x.device).cuda_stream
        s13, s2 = self.input_scales

        order, row_expert, position, offsets = sorted_routing(topk_ids, shape.experts)
        x_in, _ = operands.bf16_operands(x.contiguous(), q.act_mode, s13, x_buffers or None)
        torch.index_select(x_in, 0, order // k, out=xs)
        self._gemm(q.format, self.w13, self.scales13, rows13(shape), shape.hidden, xs, h, offsets, gemm_ws, stream)
        moe_sorted.activate(h, row_expert, self.w13.col_scale, inter, shape.activation, shape.w13_order == "up_gate")
        inter_in, _ = operands.bf16_operands(inter, shape.act_mode_2, s2, inter_buffers or None)
        self._gemm(shape.w2_format, self.w2, self.scales2, shape.hidden, shape.intermediate, inter_in.contiguous(),
                   out, offsets, gemm_ws, stream)  # fmt: skip
        y = torch.empty(t, shape.hidden, dtype=torch.bfloat16, device=x.device)
        return moe_sorted.combine(out, position, topk_ids.contiguous(), topk_weights.to(torch.float32).contiguous(),
                                  self.w2.col_scale, y)  # fmt: skip
