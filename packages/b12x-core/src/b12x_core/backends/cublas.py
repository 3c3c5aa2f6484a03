"""Backends whose GEMM is cuBLAS / cuBLASLt through torch:

- `DequantGemm`: dequantize the weight to bf16 in the device's shared workspace (one memory-bound pass: Triton's from
  the checkpoint layout; from the tensor-core layout the CUDA one, b12x_kernels.mma_dequantize, for the formats in
  DequantGemm.CUDA_PASS_FORMATS, else Triton's), then
  the dense bf16 GEMM. For operands bf16 holds exactly: bf16, mxfp8, nvfp4 (input_scale in the row factors) and
  static fp8 (e4m3 values; the static scale in the row factors). Where the plan also runs the tensor-core GEMM,
  it dequantizes that backend's repacked layout (b12x_kernels.mma_dequant, same values) instead of holding the
  checkpoint layout too: the weight is on the device once.
- `ScaledMM`: FP8 weights with static per-tensor or dynamic per-token fp8 activations: `torch._scaled_mm`, with
  tensor-wise scales where one number scales every output (static activations, one weight factor for every fused
  shard), row-wise ones otherwise (cuBLASLt's row-wise fp8 GEMM ran the Llama-3.1-8B layer 1.13-1.28× slower than
  the tensor-wise one at 64-4096 tokens on the H100: benchmarks/scaled_mm_scales.py).
- `BlockScaledMM`: FP8_BLOCK weights with 1×128 fp8 activation groups: torch's block-wise scaled FP8 GEMM
  (`torch.nn.functional.scaled_mm`, ScalingType.BlockWise1x128 × BlockWise128x128, both scales column-major).

Both fp8 GEMMs launch two kernels a call: the activation quantizer, which also writes the padding rows cuBLASLt's fp8
layouts want (zero codes, unit or static scales), and the GEMM; any fill or copy between them would cost as much,
inside a CUDA graph, as a good part of a decode-sized GEMM.
"""

from __future__ import annotations

import numpy as np
import torch

from b12x_formats.kernel_facts import FP8_BLOCK_SIZE

from .. import kernels, workspace
from ..tensor_core import geometry, layout
from ..tensor_core.gemm import MmaConfig
from ..weights import grid_table, sign_table, weight_row_factors
from . import operands
from .base import Backend, cuda_reason

FP8_ROWS = 16  # cuBLASLt's fp8 layouts want the row count of A padded to a multiple of 16
CUBLAS_SCALE_ALIGN = 4  # block-scale rows (K/128) cuBLASLt's block-scaled GEMM takes unpadded
DEQUANT_MODES = operands.BF16_EXACT_MODES
# Conservative defaults (a GPU without measurements): cuBLASLt's fp8 GEMMs past the GEMV's 16 tokens (the H200's
# fp8 _scaled_mm took over from 12 tokens when measured); dequantize + GEMM only where its extra pass over the weight
# is small next to the GEMM.
LIBRARY_FROM = 17
DEQUANT_GEMM_FROM = 256


def _pad(m: int) -> int:
    return -(-m // FP8_ROWS) * FP8_ROWS


class DequantGemm(Backend):
    name, op = "dequant_gemm", "linear"
    default_tokens = (DEQUANT_GEMM_FROM, None)
    reads = ("checkpoint", "mma")
    # Formats whose dequantization from the tensor-core layout runs the CUDA pass on a GPU (b12x_kernels.mma_dequantize:
    # the GEMM's dequantizations, about 8 instructions a weight against the Triton pass's 22 for NVFP4) instead of the
    # Triton one (same bits): the family's (MMA.dequantize_formats). `python benchmarks/dequantize_pass.py --programs
    # 16x1x4,cuda` times both passes.
    CUDA_PASS_FORMATS: tuple[str, ...] = geometry.MMA.dequantize_formats

    @classmethod
    def can_implement(cls, q):
        if q.act_mode not in DEQUANT_MODES:
            return False, f"needs bf16-exact activations ({', '.join(DEQUANT_MODES)}), not {q.act_mode}"
        why = cuda_reason(q, triton=True, kernels=False)
        if why:
            return False, why
        return True, "dequantize to a bf16 workspace, then cuBLAS bf16 GEMM"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.from_mma = weights.shared_layout == "mma"
        if self.from_mma:
            self.shards, self.row_factor = weights.mma, weights.row_factor
            device = query.device.device
            fields = np.asarray(layout.E2M1_FIELDS, dtype=np.int32).reshape(-1)
            self.fields = torch.from_numpy(fields).to(device)
            self.grid, self.signs = grid_table(query.format, device), sign_table(query.format, device)
        else:
            self.stacked = weights.stacked

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        return [(lo, hi, {"reads": "the tensor-core layout"} if layout == "mma" else {})]

    def reserve(self, rows):
        workspace.reserve_weights(self.query.device.device, self.query.n * self.query.k)

    def scratch_bytes(self, tokens, config):
        return workspace.nbytes(operands.bf16_specs(self.query.act_mode, tokens, self.query.k))

    def run(self, x2, bias, *, config):
        from ..kernels import tiles

        q = self.query
        xv, _ = operands.bf16_operands(x2.contiguous(), q.act_mode, self.weights.input_scale)
        w = workspace.weights(x2.device, q.n, q.k)
        if self.from_mma:
            self._dequantize_mma(w)
        else:
            tw = self.stacked
            tiles.dequantize_tiles(q.format, tw.weight, tw.scales, tw.col_scale, w, grid_table=tw.grid,
                                   sign_table=tw.signs)  # fmt: skip
        return torch.nn.functional.linear(xv, w, None if bias is None else bias.to(torch.bfloat16))

    def _dequantize_mma(self, w):
        """w = the weight dequantized from the tensor-core layout, shard by shard (each its own rows): the Triton pass,
        or for the formats in CUDA_PASS_FORMATS the CUDA one (the same bits)."""
        from ..kernels import mma_dequant

        for s in self.shards:
            rows = slice(s.row, s.row + s.n)
            if s.format in self.CUDA_PASS_FORMATS and w.is_cuda:  # the interpreter (CPU) runs Triton's
                args = s.args(MmaConfig(1, 1), w.stride(0), row_scale=self.row_factor[rows])
                kernels.mma_dequantize(args, w[rows].data_ptr(), torch.cuda.current_stream(w.device).cuda_stream)
                continue
            mma_dequant.dequantize_mma(s.format, s.codes, s.meta, s.meta2, s.block_scale, self.grid, self.signs,
                                       self.fields, self.row_factor[rows], w[rows], geometry.chunk_k(s.format),
                                       s.chunks)  # fmt: skip


class ScaledMM(Backend):
    name, op = "scaled_mm", "linear"
    default_tokens = (LIBRARY_FROM, None)

    @classmethod
    def can_implement(cls, q):
        if q.format != "FP8" or q.act_mode not in ("fp8_static", "fp8_token"):
            return False, f"runs FP8 × fp8_static / fp8_token, not {q.format} × {q.act_mode}"
        if q.n % 16 or q.k % 16:
            return False, f"needs N and K multiples of 16 (fp8 layouts), got N={q.n}, K={q.k}"
        why = cuda_reason(q, triton=True, kernels=False)
        if why:
            return False, why
        return True, "cuBLASLt fp8 GEMM (torch._scaled_mm: tensor-wise scales where one number scales every row)"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.stacked = weights.stacked
        self.static_scale = operands.in_kernel_scale(query.act_mode, weights.input_scale)  # fp8_static's, else 0
        device = query.device.device
        # Tensor-wise: fp8_static's scale and the one weight factor of every row, each a 0-d tensor (cuBLASLt takes a
        # row-wise scale of the tokens only beside a row-wise one of the weight, so per-token activations cannot).
        self.tensorwise = None
        if query.act_mode == "fp8_static":
            # The quantizer hands the GEMM fp8_static's scale as scale_a (a column it writes in the same launch), so
            # scale_b holds the weight's factors alone; the stacked col_scale, which carries the static scale for
            # the backends that leave it out of the activations, would count it twice.
            factors = np.ascontiguousarray(weight_row_factors(weights.shards), dtype=np.float32).reshape(1, -1)
            self.scale_b = torch.from_numpy(factors).to(device)
            if np.all(factors == factors[0, 0]):
                self.tensorwise = (torch.tensor(self.static_scale, dtype=torch.float32, device=device),
                                   torch.tensor(factors[0, 0], dtype=torch.float32, device=device))  # fmt: skip
        else:
            self.scale_b = weights.stacked.col_scale.reshape(1, -1)

    def scratch_bytes(self, tokens, config):
        return workspace.nbytes(self._specs(tokens))

    def _specs(self, tokens):
        """e4m3 codes [rows, K] and the row-wise scale column [rows, 1], rows padded for cuBLASLt's fp8 layouts"""
        rows = _pad(tokens)
        return [((rows, self.query.k), torch.uint8), ((rows, 1), torch.float32)]

    def run(self, x2, bias, *, config):
        """Two kernels: the activation quantizer (codes and each row's scale, fp8_static's scale or the token's,
        padding rows included: zero codes) and cuBLASLt's GEMM. The output is a view of the GEMM's padded rows."""
        from ..kernels import act_quant

        q = self.query
        m = x2.shape[0]
        codes, scale_a = workspace.carve(x2.device, self._specs(m))
        scale_b = self.scale_b
        if self.tensorwise is not None:
            scale_a, scale_b = self.tensorwise
        act_quant.quantize_fp8(x2.contiguous(), q.act_mode, codes, None if self.tensorwise else scale_a,
                               self.static_scale, rows=codes.shape[0])  # fmt: skip
        bias = None if bias is None else bias.to(torch.bfloat16)
        y = torch._scaled_mm(codes.view(torch.float8_e4m3fn), self.stacked.weight.t(), scale_a=scale_a,
                             scale_b=scale_b, bias=bias, out_dtype=torch.bfloat16)  # fmt: skip
        return y[:m]


class BlockScaledMM(Backend):
    name, op = "block_scaled_mm", "linear"
    default_tokens = (LIBRARY_FROM, None)

    @classmethod
    def can_implement(cls, q):
        if q.format != "FP8_BLOCK" or q.act_mode != "fp8_group128":
            return False, f"runs FP8_BLOCK × fp8_group128, not {q.format} × {q.act_mode}"
        if q.k % FP8_BLOCK_SIZE or any(rows % FP8_BLOCK_SIZE for rows in q.shard_rows):
            return False, f"needs K and every fused shard's rows in whole 128-blocks, got K={q.k}, rows {q.shard_rows}"
        if (q.k // FP8_BLOCK_SIZE) % CUBLAS_SCALE_ALIGN:
            # torch 2.11 on the H200: "scale_b must have shape 8 x 2" for K/128 = 5 (cuBLASLt pads scale rows to 4)
            return False, f"needs K/128 a multiple of {CUBLAS_SCALE_ALIGN} (cuBLASLt's block-scale layout), K is {q.k}"
        why = cuda_reason(q, triton=True, kernels=False) or q.device.block_scaled_mm
        if why:
            return False, why
        return True, "cuBLASLt block-scaled fp8 GEMM (torch scaled_mm, 1×128 × 128×128 scales)"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.weight = weights.stacked.weight  # e4m3 [N, K]
        # [⌈N/128⌉, ⌈K/128⌉] row-major: its transpose is the column-major [K/128, N/128] scale of B = weightᵀ
        self.scale_b = weights.block_scale_grid.t()

    def scratch_bytes(self, tokens, config):
        return workspace.nbytes(self._specs(tokens))

    def _specs(self, tokens):
        """e4m3 codes [rows, K] and the 1×128 scales stored transposed ([K/128, rows]: column-major once viewed back)"""
        rows = _pad(tokens)
        return [((rows, self.query.k), torch.uint8), ((self.query.k // FP8_BLOCK_SIZE, rows), torch.float32)]

    def run(self, x2, bias, *, config):
        """Two kernels: the activation quantizer (codes and 1×128 scales, padding rows included) and cuBLASLt's
        block-scaled GEMM; a third, the bias add, only with a bias."""
        from torch.nn.functional import ScalingType, scaled_mm

        from ..kernels import act_quant

        m = x2.shape[0]
        codes, scales = workspace.carve(x2.device, self._specs(m))
        scale_a = scales.t()  # [rows, K/128], column-major: what BlockWise1x128 reads
        # padding rows come out of the same launch: zero codes, unit scales (their outputs are dropped)
        act_quant.quantize_fp8(x2.contiguous(), "fp8_group128", codes, scale_a, rows=codes.shape[0])
        y = scaled_mm(codes.view(torch.float8_e4m3fn), self.weight.t(), scale_a, ScalingType.BlockWise1x128,
                      self.scale_b, ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)  # fmt: skip
        y = y[:m]
        return y if bias is None else y + bias.to(torch.bfloat16)
