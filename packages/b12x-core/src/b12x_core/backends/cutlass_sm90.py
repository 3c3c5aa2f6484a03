"""The Hopper mixed-input GEMM on CUTLASS's SM90 pieces (b12x_kernels.sm90_mixed_gemm, csrc/sm90_mixed_gemm.cuh):
TMA loads, a producer warp and two cooperative consumer warpgroups, wgmma with the weight converted to bf16 in
registers, the persistent stream-K tile scheduler and CUTLASS's epilogue (per-row factor and bias, bf16 out).

FP8, NVFP4, MXFP4, MXFP8 and Q8_0 weights (interface.SM90_MIXED) with the bf16-exact activation modes, compute
capability 9.0, N and K multiples of 64. Two forms, by the weight layout they read: `CutlassSm90` its own ("sm90": the
codes reordered so each thread's fragment is one shared-memory load), `CutlassSm90Checkpoint` the checkpoint's bytes
the GEMV, Triton and cuBLAS backends read too (so a plan can hold one copy; FP8 only,
interface.SM90_MIXED_CHECKPOINT_FORMATS). Both take the block scales as one carrier per row and 64-deep k-tile
([K/64, N, 4 or 2 bytes], a small copy made at prepare); Q8_0's blocks are split at prepare into int8 codes, reordered
as FP8's are, and a carrier of the row's two fp16 d's per k-tile ([K/64, N, 2] float16). Late in the registry: the
plan picks them only where a measured table says they are faster.
"""

from __future__ import annotations

import math

import torch

from .. import kernels, workspace
from ..kernels import interface
from . import operands
from .base import Backend, config_ranges
from .sm90_layout import checkpoint_weight, reader_reason, reordered_weight

FAMILY = interface.SM90_MIXED
# The scheduler's split (interface.SM90_MIXED_DECOMPOSITIONS), a plan row's config: CUTLASS's heuristic chooses
# data-parallel or stream-K per shape and SM count.
DECOMPOSITION = "heuristic"
SHORT_K = 8192  # token_tile: up to this K, a 256-token grid short of half the SMs takes 128-token tiles


def token_tile(fmt: str, m: int, n: int, k: int, sms: int) -> int:
    """The CTA tile's tokens for a call of m tokens of an N x K weight on `sms` SMs (a plan row's config "tokens", one
    of FAMILY.token_tiles). Every tile converts its weight tile again, and a tile's padded tokens still cost MMAs: 16 up
    to 16 tokens, where a wider tile's MMAs take longer than reading the weight; 64 up to 64; then 128, and 256 (each
    weight tile converted once for twice the tokens) from where conversion outweighs the wider tile's fewer, longer
    waves: 193 tokens for 4-bit codes, 513 for FP8 (benchmarks/sm90_tiles.py on the H100: the 8B layer, 4-bit at 256
    tokens 213 µs with 256 against 236 with 128; FP8 at 512 319 against 333). MXFP8 and Q8_0, unmeasured, take the
    4-bit kinds' rule: like theirs, their conversion multiplies every value by a block scale, which FP8's does not.
    Where the 256-token tiles would not fill half the SMs and K is short, 128 stays: its twice as many CTAs won on the
    8B o and qkv (NVFP4 at 256 tokens: o 26.5 against 33.0 µs, qkv 32.8 against 34.7; o at 512: 32.8 against 35.5),
    while a long K keeps 256 (down, K = 14336, at 256 tokens: 57.5 against 62.1; stream-K splits its K)."""
    if m <= 16:
        return 16
    if m <= 64:
        return 64
    if m <= (512 if fmt == "FP8" else 192):
        return 128
    wide_tiles = math.ceil(n / 128) * math.ceil(m / 256)
    return 128 if 2 * wide_tiles < sms and k <= SHORT_K else 256


def _decomposition(config) -> int:
    return interface.SM90_MIXED_DECOMPOSITIONS.index(config["decomposition"])


class CutlassSm90(Backend):
    name, op = "cutlass_sm90", "linear"
    reads = ("sm90",)
    KEY, MAKE = "sm90", staticmethod(reordered_weight)  # the layout it reads, and how it is made

    @classmethod
    def can_implement(cls, q):
        if q.format not in FAMILY.formats:
            return False, f"converts {', '.join(FAMILY.formats)}, not {q.format}"
        why = reader_reason(q, FAMILY)
        if why:
            return False, why
        return True, "CUTLASS SM90 mixed-input GEMM (TMA, warp-specialized wgmma, stream-K; weight in registers)"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.layout = weights.shared(self.KEY, lambda: self.MAKE(query, weights))

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        q = query
        return config_ranges(lo, hi, lambda m: {"decomposition": DECOMPOSITION,
                                                "tokens": token_tile(q.format, m, q.n, q.k, q.device.sms)})  # fmt: skip

    def _scheduler_bytes(self, tokens: int, config) -> int:
        q = self.query
        return kernels.sm90_mixed_workspace_bytes(interface.SM90_MIXED_WEIGHTS[q.format], self.layout.reordered, tokens,
                                                  q.n, q.k, _decomposition(config), q.device.sms,
                                                  config["tokens"])  # fmt: skip

    def _specs(self, tokens: int, config, scheduler_bytes: int) -> list:
        """The bf16 operands (modes other than bf16) and the scheduler's scratch (16 bytes at least: a pointer)."""
        return operands.bf16_specs(self.query.act_mode, tokens, self.query.k) + [((max(scheduler_bytes, 16),),
                                                                                 torch.uint8)]  # fmt: skip

    def scratch_bytes(self, tokens, config):
        # The scheduler's scratch follows the count of token tiles, not monotonically (stream-K splits fewer tiles
        # finer): the most over every tile count up to `tokens`.
        tile = config["tokens"]
        most = max(self._scheduler_bytes(min(t, tokens), config) for t in range(tile, tokens + tile, tile))
        return workspace.nbytes(self._specs(tokens, config, most))

    def run(self, x2, bias, *, config):
        q = self.query
        m = x2.shape[0]
        operand_specs = operands.bf16_specs(q.act_mode, m, q.k)
        carved = workspace.carve(x2.device, self._specs(m, config, self._scheduler_bytes(m, config)))
        xv, _ = operands.bf16_operands(x2.contiguous(), q.act_mode, self.weights.input_scale,
                                       carved[: len(operand_specs)] or None)  # fmt: skip
        xv = xv.contiguous()
        y = torch.empty(m, q.n, dtype=torch.bfloat16, device=x2.device)
        if bias is not None:
            bias = bias.to(torch.bfloat16).contiguous()
        lay, scratch = self.layout, carved[-1]
        kernels.sm90_mixed_gemm(
            interface.SM90_MIXED_WEIGHTS[q.format], lay.reordered, m, q.n, q.k, lay.codes.data_ptr(),
            0 if lay.scales is None else lay.scales.data_ptr(), xv.data_ptr(), y.data_ptr(),
            lay.row_factor.data_ptr(), 0 if bias is None else bias.data_ptr(),
            _decomposition(config), q.device.sms, scratch.data_ptr(),
            scratch.numel(), torch.cuda.current_stream(x2.device).cuda_stream, config["tokens"],
        )  # fmt: skip
        return y


class CutlassSm90Checkpoint(CutlassSm90):
    name = "cutlass_sm90_checkpoint"
    reads = ("checkpoint",)
    KEY, MAKE = "sm90_checkpoint", staticmethod(checkpoint_weight)

    @classmethod
    def can_implement(cls, q):
        if q.format in FAMILY.formats and q.format not in interface.SM90_MIXED_CHECKPOINT_FORMATS:
            kinds = ", ".join(interface.SM90_MIXED_CHECKPOINT_FORMATS)
            return False, f"reads the checkpoint layout of {kinds} only, not {q.format} (cutlass_sm90 reorders it)"
        return super().can_implement(q)
