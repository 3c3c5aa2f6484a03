"""The block-scaled GEMM on the device: the repacked weight (layout.pack), every fused row shard in one launch with
each row's factor (weights.row_factors: a shard's per-tensor weight scale times nvfp4's input_scale) in `row_scale`,
the argument block (b12x_kernels.interface.BsmmaArgs) packed once per token tile, and the launch: the activation pass
into scratch, then the GEMM (two kernels, one binding)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .. import kernels, pdl
from . import layout


@dataclass
class BsmmaShard:
    instruction: str  # block_scaled_mma.DEVICE_INSTRUCTIONS' name
    n: int
    k: int
    units: int
    codes: torch.Tensor  # uint8, layout.pack's order
    scales: torch.Tensor  # uint8
    row_scale: torch.Tensor  # float32 [n] (grouped: [experts · n], for the MoE's passes)
    x_scale: float  # nvfp4: the global scale 1 / input_scale (float32); 0 for mxfp8
    pdl: int = 0
    experts: int = 1  # grouped: the experts' layouts, `expert_codes` / `expert_scales` bytes apart
    packed: dict = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> int:
        interface = kernels.interface
        if not layout.scaled(self.instruction):
            return interface.BSMMA_KIND_FP8
        return kernels.block_scaled_mma.kind_id(layout.instruction(self.instruction))

    def args(self, mt: int, ldy: int, *, grouped: bool = False, out_f32: bool = False, row_scale: bool = True) -> bytes:
        """The argument block: `grouped` (the MoE: experts apart, y float32, row factors left to its passes)."""
        key = (mt, ldy, grouped, out_f32, row_scale)
        if key not in self.packed:
            interface = kernels.interface
            per_codes, per_scales = self.codes.numel() // self.experts, self.scales.numel() // self.experts
            self.packed[key] = interface.pack(
                interface.BsmmaArgs, kind=self.kind, codes=self.codes.data_ptr(),
                scales=self.scales.data_ptr() if self.scales.numel() else 0,
                row_scale=self.row_scale.data_ptr() if row_scale else 0, x_scale=self.x_scale, ldy=ldy, N=self.n,
                K=self.k, units=self.units, mt=mt, pdl=self.pdl, expert_codes=per_codes if grouped else 0,
                expert_scales=per_scales if grouped else 0, out_f32=int(out_f32),
            )  # fmt: skip
        return self.packed[key]


def upload(w: layout.BsmmaWeight | list[layout.BsmmaWeight], row_scale: np.ndarray, x_scale: float,
           device) -> BsmmaShard:  # fmt: skip
    """One weight's layout, or the experts' (each the same shape: one tensor, expert e at e · its bytes)."""
    ws = w if isinstance(w, list) else [w]

    def up(parts: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(np.concatenate(parts))).to(device)

    first = ws[0]
    return BsmmaShard(first.instruction, first.n, first.k, first.units, up([x.codes for x in ws]),
                      up([x.scales for x in ws]), up([np.asarray(row_scale, dtype=np.float32)]), x_scale,
                      pdl.enabled(), len(ws))  # fmt: skip


def prepare(shards, act_mode: str, row_scale: np.ndarray, x_scale: float, device) -> BsmmaShard:
    """Row shards of one weight -> one BsmmaShard over all their rows."""
    return upload(layout.pack(shards, act_mode), row_scale, x_scale, device)


def run(x2: torch.Tensor, shard: BsmmaShard, y: torch.Tensor, bias: torch.Tensor | None, mt: int,
        buffers: list[torch.Tensor], stream: int, act_mode: str = "", static_scale: float = 1.0) -> None:  # fmt: skip
    """y = x̂2 @ W.T · row_scale (+ bias): x2 bf16 [M, K] contiguous, y bf16 [M, ldy], bias bf16 [N] or None;
    `buffers`: the activation pass's scratch (layout.x_specs). FP8: the fp8 pass (act_mode fp8_static with its
    `static_scale`, or fp8_token) first, its per-token scale to the epilogue."""
    xq, xs = buffers
    bias_ptr = 0 if bias is None else bias.data_ptr()
    if layout.scaled(shard.instruction):
        kernels.bsmma_gemm(shard.args(mt, y.shape[1]), x2.data_ptr(), xq.data_ptr(), xs.data_ptr(), bias_ptr,
                           y.data_ptr(), x2.shape[0], stream)  # fmt: skip
        return
    from ..kernels import act_quant

    token = act_mode == "fp8_token"
    act_quant.quantize_fp8(x2, act_mode, xq, xs if token else None, static_scale)
    kernels.bsmma_mma(shard.args(mt, y.shape[1]), xq.data_ptr(), 0, xs.data_ptr() if token else 0, 0, 0, bias_ptr,
                      y.data_ptr(), x2.shape[0], stream)  # fmt: skip


def quantize(x2: torch.Tensor, shard: BsmmaShard, buffers: list[torch.Tensor], stream: int) -> None:
    """The block-scaled activation pass alone: x2 bf16 [M, K] contiguous -> buffers (layout.x_specs)."""
    xq, xs = buffers
    kernels.bsmma_quantize(shard.args(1, shard.n), x2.data_ptr(), xq.data_ptr(), xs.data_ptr(), x2.shape[0], stream)


def grouped(shard: BsmmaShard, buffers: list[torch.Tensor], table: torch.Tensor, y: torch.Tensor, mt: int,
            stream: int) -> None:  # fmt: skip
    """The grouped GEMM: y float32 [rows, N] (sorted rows) = each table block's quantized rows (buffers, as
    `quantize` wrote them) times its expert's weight, without row factors; table int32 [3, blocks] (moe_blocks)
    of 8·mt-row blocks."""
    xq, xs = buffers
    blocks = table.shape[1]
    kernels.bsmma_mma(shard.args(mt, y.shape[1], grouped=True, out_f32=True, row_scale=False), xq.data_ptr(),
                      xs.data_ptr(), 0, table.data_ptr(), blocks, 0, y.data_ptr(), y.shape[0], stream)  # fmt: skip
