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
    row_scale: torch.Tensor  # float32 [n]
    x_scale: float  # nvfp4: the global scale 1 / input_scale (float32); 0 for mxfp8
    pdl: int = 0
    packed: dict = field(default_factory=dict, repr=False)

    def args(self, mt: int, ldy: int) -> bytes:
        key = (mt, ldy)
        if key not in self.packed:
            interface = kernels.interface
            self.packed[key] = interface.pack(
                interface.BsmmaArgs, kind=kernels.block_scaled_mma.kind_id(layout.instruction(self.instruction)),
                codes=self.codes.data_ptr(), scales=self.scales.data_ptr(), row_scale=self.row_scale.data_ptr(),
                x_scale=self.x_scale, ldy=ldy, N=self.n, K=self.k, units=self.units, mt=mt, pdl=self.pdl,
            )  # fmt: skip
        return self.packed[key]


def upload(w: layout.BsmmaWeight, row_scale: np.ndarray, x_scale: float, device) -> BsmmaShard:
    def up(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    return BsmmaShard(w.instruction, w.n, w.k, w.units, up(w.codes), up(w.scales),
                      up(np.asarray(row_scale, dtype=np.float32)), x_scale, pdl.enabled())  # fmt: skip


def prepare(shards, act_mode: str, row_scale: np.ndarray, x_scale: float, device) -> BsmmaShard:
    """Row shards of one weight -> one BsmmaShard over all their rows."""
    return upload(layout.pack(shards, act_mode), row_scale, x_scale, device)


def run(x2: torch.Tensor, shard: BsmmaShard, y: torch.Tensor, bias: torch.Tensor | None, mt: int,
        buffers: list[torch.Tensor], stream: int) -> None:  # fmt: skip
    """y = x̂2 @ W.T · row_scale (+ bias): x2 bf16 [M, K] contiguous, y bf16 [M, ldy], bias bf16 [N] or None;
    `buffers`: the activation pass's scratch (layout.x_specs)."""
    xq, xs = buffers
    kernels.bsmma_gemm(shard.args(mt, y.shape[1]), x2.data_ptr(), xq.data_ptr(), xs.data_ptr(),
                       0 if bias is None else bias.data_ptr(), y.data_ptr(), x2.shape[0], stream)  # fmt: skip
