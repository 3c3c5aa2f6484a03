"""SM12x's block-scaled mma.sync GEMM (b12x_kernels.bsmma_gemm, csrc/bsmma_gemm.cu): NVFP4 × nvfp4, MXFP8 × mxfp8
and MXFP4 × mxfp8 on the instruction that multiplies E2M1 / E4M3 codes with their block scales (interface.BSMMA's
table: format × activation mode -> instruction). The weight is repacked once into the lanes' A register order (its
own layout, "bsmma": block_scaled.layout), the activations quantized into codes and scale bytes by a pass before the
GEMM, each row's per-tensor factor (nvfp4's input_scale included) in the epilogue.

FP8 × fp8 (fp8_static, fp8_token) runs the same GEMM on the plain E4M3 mma.sync m16n8k32 (no block scales: MXF8's
fragments and code layout; native on sm_89+, so both builds issue it): the activations are the fp8 pass's e4m3 codes
(b12x_kernels.act_quant, Triton), each shard's per-tensor weight factor (times fp8_static's input_scale) in
`row_scale`, fp8_token's per-token scale in the epilogue. It reads the pass's rows of K codes, so K % 128 == 0.

On a GPU of compute capability 12.x the plans choose it for these pairs at every token count (first in the registry;
nothing is measured there yet). Elsewhere it declines: the sm_90 build computes the instruction's exact model instead
(bsmma::emulate), which tests and the self-test run by name (plan.build(..., only=BlockScaledMma)). Its first prepare on
an SM12x GPU runs block_scaled.probe; where the GPU disagrees with the reference it withdraws for the process.

Configuration: 8 tokens a warp up to 8 tokens, else 32 (interface.BSMMA.token_tiles: mt 1 or 4).
"""

from __future__ import annotations

import torch

from .. import workspace
from ..block_scaled import gemm, layout, probe
from .base import Backend, config_ranges, cuda_reason
from .operands import in_kernel_scale


def _pairs() -> str:
    return ", ".join(f"{f} × {a}" for f, a in layout.FAMILY.instructions)


class BlockScaledMma(Backend):
    name, op = "block_scaled_mma", "linear"
    reads = ("bsmma",)

    @classmethod
    def can_implement(cls, q):
        name = layout.instruction_of(q.format, q.act_mode)
        if name is None:
            return False, f"runs {_pairs()}, not {q.format} × {q.act_mode}"
        if name == layout.FP8 and q.k % layout.UNIT:
            return False, f"FP8 reads the fp8 pass's rows whole: needs K % {layout.UNIT} == 0, K is {q.k}"
        if q.shares_bytes:
            return False, "repacks the weight into its own layout; this op shares another op's bytes (tied head)"
        why = cuda_reason(q, triton=name == layout.FP8)  # FP8's activations: the Triton fp8 pass
        if why:
            return False, why
        why = layout.sm12x_reason(q)
        if why:
            return False, why
        why = probe.failed(q.device.device, name)
        if why:
            return False, f"withdrawn in this process: its first-use probe disagreed ({why})"
        if name == layout.FP8:
            return True, "SM12x mma.sync m16n8k32 e4m3 × e4m3 (per-tensor / per-token scales in the epilogue)"
        return True, f"SM12x block-scaled mma.sync ({layout.instruction(name).ptx.split('.kind::')[1]})"

    @classmethod
    def prepare(cls, query, weights):
        name = layout.instruction_of(query.format, query.act_mode)
        if layout.scaled(name):  # the plain E4M3 mma.sync is no new instruction model: no probe
            probe.first_use(query, name)
        return cls(query, weights)

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.instruction = layout.instruction_of(query.format, query.act_mode)
        x_scale = in_kernel_scale(query.act_mode, weights.input_scale)  # fp8_static: its input_scale
        row_scale = weights.row_factor.cpu().numpy()
        self.shard = weights.shared("bsmma", lambda: gemm.prepare(weights.shards, query.act_mode, row_scale, x_scale,
                                                                  weights.device))  # fmt: skip

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        small, large = (8 * mt for mt in cls.token_tiles())
        return config_ranges(lo, hi, lambda m: {"tokens": small if m <= small else large})

    @staticmethod
    def token_tiles() -> tuple[int, int]:
        return layout.FAMILY.token_tiles

    def scratch_bytes(self, tokens, config):
        return workspace.nbytes(layout.x_specs(self.instruction, tokens, self.query.k))

    def run(self, x2, bias, *, config):
        q = self.query
        m = x2.shape[0]
        buffers = workspace.carve(x2.device, layout.x_specs(self.instruction, m, q.k))
        y = torch.empty(m, q.n, dtype=torch.bfloat16, device=x2.device)
        if bias is not None and bias.dtype != torch.bfloat16:
            bias = bias.to(torch.bfloat16)
        stream = torch.cuda.current_stream(x2.device).cuda_stream
        gemm.run(x2.contiguous(), self.shard, y, bias, config["tokens"] // 8, buffers, stream, q.act_mode,
                 self.shard.x_scale)  # fmt: skip
        return y
