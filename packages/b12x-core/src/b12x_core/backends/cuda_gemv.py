"""The CUDA decode GEMV (b12x_kernels.gemv_ggml / gemv_elem): one warp per output row, each weight byte read
once per launch for up to 16 tokens. Raw GGML blocks with bf16 activations; element formats with every
activation mode whose operand is bf16-exact: bf16, mxfp8, nvfp4 (input_scale folded into the row factor) and
the fp8 modes as their e4m3 values with per-token or per-128-column scales applied inside the kernel.

Configuration: `max_m`, the kernel's accumulator bucket (registers grow with it), the smallest of 1, 2, 4, 8, 16
that holds the call; calls beyond 16 tokens run as consecutive 16-token launches.
"""

from __future__ import annotations

import torch

from b12x_formats.kernel_facts import format_id

from .. import kernels, pdl, workspace
from ..kernels import interface
from . import operands
from .base import Backend, cuda_reason

GGML_GEMV, ELEM_GEMV = interface.GEMV_GGML, interface.GEMV_ELEM  # the two kernels' capability models
BUCKETS = ELEM_GEMV.token_tiles  # the kernels' accumulator buckets (max_m)
LAUNCH_TOKENS = BUCKETS[-1]


def bucket(tokens: int) -> int:
    return next((b for b in BUCKETS if tokens <= b), LAUNCH_TOKENS)


class CudaGemv(Backend):
    name, op = "cuda_gemv", "linear"
    default_tokens = (1, LAUNCH_TOKENS)

    @classmethod
    def can_implement(cls, q):
        if q.format in GGML_GEMV.formats:
            if q.act_mode not in GGML_GEMV.act_modes:
                return False, f"runs GGML formats with bf16 activations, not {q.format} × {q.act_mode}"
        elif q.format not in ELEM_GEMV.formats or q.act_mode not in ELEM_GEMV.act_modes:
            return False, f"runs {q.format} × {', '.join(ELEM_GEMV.act_modes)}; not {q.act_mode}"
        elif q.k % 8:
            return False, f"needs K % 8 == 0, K is {q.k}"
        why = cuda_reason(q)
        if why:
            return False, why
        return True, f"CUDA GEMV ({LAUNCH_TOKENS} tokens per launch, each weight byte read once per launch)"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        q = query
        # The kernels' argument blocks per accumulator bucket (and row shard): a call passes only x, y and m.
        launch_pdl = pdl.enabled()
        if q.format in GGML_GEMV.formats:
            self.blocks, grid = weights.ggml_blocks, weights.stacked.grid
            self.packed = {b: interface.pack(interface.GemvGgmlArgs, format=format_id(q.format),
                                             w=self.blocks.data_ptr(), grid=0 if grid is None else grid.data_ptr(),
                                             N=q.n, K=q.k, max_m=b, pdl=launch_pdl) for b in BUCKETS}  # fmt: skip
            return
        self.shards = weights.element_shards
        cols = operands.x_scale_cols(q.act_mode, q.k)
        self.packed = {b: [interface.pack(interface.GemvElemArgs, format=format_id(q.format), w=s.weight.data_ptr(),
                                          scales=0 if s.scales is None else s.scales.data_ptr(),
                                          tensor_scale=s.tensor_scale, x_scale_cols=cols, ldy=q.n, N=s.rows, K=q.k,
                                          max_m=b, pdl=launch_pdl) for s in self.shards] for b in BUCKETS}  # fmt: skip

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        out = []
        for b in BUCKETS:
            first, last = max(lo, 1 if b == 1 else b // 2 + 1), min(hi, b)
            if first <= last:
                out.append((first, last, {"max_m": b}))
        if hi > LAUNCH_TOKENS:
            out.append((max(lo, LAUNCH_TOKENS + 1), hi, {"max_m": LAUNCH_TOKENS, "launches": "⌈M/16⌉"}))
        return out

    def scratch_bytes(self, tokens, config):
        return workspace.nbytes(operands.bf16_specs(self.query.act_mode, tokens, self.query.k))

    def run(self, x2, bias, *, config):
        q = self.query
        m = x2.shape[0]
        xv, x_scale = operands.bf16_operands(x2.contiguous(), q.act_mode, self.weights.input_scale)
        y = torch.empty(m, q.n, dtype=torch.bfloat16, device=x2.device)
        if bias is not None and bias.dtype != torch.bfloat16:
            bias = bias.to(torch.bfloat16)
        stream = torch.cuda.current_stream(x2.device).cuda_stream
        packed = self.packed[config["max_m"]]
        for start in range(0, m, LAUNCH_TOKENS):
            tokens = min(LAUNCH_TOKENS, m - start)
            x_row, y_row = xv[start].data_ptr(), y[start]
            if q.format in GGML_GEMV.formats:
                kernels.gemv_ggml(packed, x_row, 0 if bias is None else bias.data_ptr(), y_row.data_ptr(), tokens,
                                       stream)  # fmt: skip
                continue
            scale_ptr = 0 if x_scale is None else x_scale[start].data_ptr()
            for s, args in zip(self.shards, packed, strict=True):  # each shard writes its columns of y (row stride N)
                kernels.gemv_elem(args, x_row, scale_ptr, 0 if bias is None else bias[s.row :].data_ptr(),
                                       y_row[s.row :].data_ptr(), tokens, stream)  # fmt: skip
        return y
