"""The decode-sized GEMM on the Hopper CUTLASS family's reordered weight layout (b12x_kernels.fragment_mma_gemm,
csrc/fragment_mma.cu): mma.sync m16n8k16 with each lane's A fragment one 32-bit word of that layout, block scales
from the same carriers, K split across CTAs for small N with an in-order reduction (the same bits every call).

It exists so that a plan can hold the CUTLASS family's copy of an FP4 weight for every token count: that family's
wgmma tiles run prefill, and this runs the few-token calls a GEMV or the `mma` family would otherwise need their own
copy for. NVFP4 and MXFP4 with the bf16-exact activation modes; compute capability 9.0 (the layout is made by the
sm_90a reorder); N and K multiples of 64. Late in the registry: the plan picks it only where a measured table says it
is faster.

Each weight is decoded exactly as the `mma` family decodes it (value · 2^-126 bit patterns times block scale ·
scale_mul in one bf16 multiply, tensor_core.layout.decode_range), exact under the same contract.
"""

from __future__ import annotations

import math

import torch

from .. import kernels, workspace
from ..kernels import interface
from ..tensor_core import layout as mma_layout
from . import operands
from .base import Backend, config_ranges
from .sm90_layout import TILE_K, reader_reason, reordered_weight

FAMILY = interface.FRAGMENT_MMA
GEMV_TOKENS = 4  # the first token tile: 16-row CTAs whose warps split K (csrc fragment_gemv_kernel)
CTA_ROWS = 128  # the other tiles' CTAs: a warp's 16 rows each
STEP_TILES = 4  # k-tiles a 128-row CTA's step covers (csrc kBatch)
WARPS = 8
# The 128-row form's K split: the largest power of two that keeps the grid within this many CTAs an SM and divides
# the K steps evenly (benchmarks/fragment_splits.py on the H100, the 8B layer at 1-32 tokens: splits of 9 or 6 that
# leave a last step short ran 20-40% slower than 8; the rule's 8 for qkv, o and down and 1 for gate_up were each
# linear's fastest or within 10% of it)
MOST_CTAS_PER_SM = 3


def token_tile(m: int) -> int:
    """Tokens a CTA multiplies a pass (FAMILY.token_tiles): the smallest tile that holds m, else the largest (a call
    of more tokens makes several passes over the weight)."""
    return next((t for t in FAMILY.token_tiles if m <= t), FAMILY.token_tiles[-1])


def k_splits(n: int, k: int, m: int, sms: int) -> int:
    """The K split for m tokens. The 16-row form splits K over its warps already: across CTAs only where its row
    groups leave SMs idle (one split was the fastest for every 8B linear at 1-8 tokens). The 128-row form: see
    MOST_CTAS_PER_SM."""
    tile = token_tile(m)
    passes, k_tiles = math.ceil(m / tile), k // TILE_K
    if tile == GEMV_TOKENS:
        return max(1, min(k_tiles // WARPS, math.ceil(sms / (n // 16 * passes))))
    blocks, steps = math.ceil(n / CTA_ROWS) * passes, k_tiles // STEP_TILES
    splits = 1
    while 2 * splits <= steps and steps % (2 * splits) == 0 and blocks * 2 * splits <= MOST_CTAS_PER_SM * sms:
        splits *= 2
    return splits


class FragmentMma(Backend):
    name, op = "fragment_mma", "linear"
    reads = ("sm90",)
    KEY = "sm90"  # the layout it shares with backends.cutlass_sm90.CutlassSm90 (same key, same maker)

    @classmethod
    def can_implement(cls, q):
        if q.format not in FAMILY.formats:
            return False, f"decodes {', '.join(FAMILY.formats)}, not {q.format}"
        why = reader_reason(q, FAMILY)
        if why:
            return False, why
        return True, "mma.sync GEMM on the CUTLASS SM90 layout (each lane's fragment one word; split K)"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.layout = weights.shared(self.KEY, lambda: reordered_weight(query, weights))
        scales = self.layout.scales.cpu().numpy()  # prepare time: the largest block scale sets the decode's range
        self.scale_mul, self.alpha_shift = mma_layout.decode_range(query.format, {"weight_scale": scales})
        self.tickets_needed = 0

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        q = query
        return config_ranges(lo, hi, lambda m: {"tokens": token_tile(m), "splits": k_splits(q.n, q.k, m, q.device.sms)})

    def tickets_of(self, tokens: int, config) -> int:
        return kernels.fragment_mma_tickets(tokens, self.query.n, config["splits"], config["tokens"])

    def reserve(self, rows):
        # the most any call of the plan's rows takes (tickets grow with the passes, so each row's largest call)
        self.tickets_needed = max([0] + [self.tickets_of(hi, config) for _, hi, config in rows])
        workspace.reserve_tickets(self.query.device.device, self.tickets_needed)

    def _specs(self, tokens: int, config) -> list:
        """The bf16 operands (modes other than bf16) and the split's float32 partials."""
        floats = kernels.fragment_mma_partial_floats(tokens, self.query.n, config["splits"], config["tokens"])
        partials = [((floats,), torch.float32)] if floats else []
        return operands.bf16_specs(self.query.act_mode, tokens, self.query.k) + partials

    def scratch_bytes(self, tokens, config):
        return workspace.nbytes(self._specs(tokens, config))

    def run(self, x2, bias, *, config):
        q = self.query
        m = x2.shape[0]
        operand_specs = operands.bf16_specs(q.act_mode, m, q.k)
        specs = self._specs(m, config)
        carved = workspace.carve(x2.device, specs)
        xv, _ = operands.bf16_operands(x2.contiguous(), q.act_mode, self.weights.input_scale,
                                       carved[: len(operand_specs)] or None)  # fmt: skip
        xv = xv.contiguous()
        if xv.data_ptr() % 16:  # the kernel copies rows 16 bytes at a time
            xv = xv.clone()
        partials = carved[-1] if len(specs) > len(operand_specs) else None
        count = self.tickets_of(m, config)
        tickets = workspace.tickets(x2.device, max(count, self.tickets_needed)) if count else None
        y = torch.empty(m, q.n, dtype=torch.bfloat16, device=x2.device)
        if bias is not None:
            bias = bias.to(torch.bfloat16).contiguous()
        lay = self.layout
        kernels.fragment_mma_gemm(
            interface.SM90_MIXED_WEIGHTS[q.format], m, q.n, q.k, lay.codes.data_ptr(), lay.scales.data_ptr(),
            xv.data_ptr(), y.data_ptr(), lay.row_factor.data_ptr(), 0 if bias is None else bias.data_ptr(),
            self.scale_mul, self.alpha_shift, config["tokens"], config["splits"],
            0 if partials is None else partials.data_ptr(), 0 if partials is None else partials.numel(),
            0 if tickets is None else tickets.data_ptr(), 0 if tickets is None else tickets.numel(),
            torch.cuda.current_stream(x2.device).cuda_stream,
        )  # fmt: skip
        return y
