"""The tensor-core mixed-input GEMM (b12x_kernels.mma_gemm) for a linear's row shards: weights repacked once by
tensor_core.layout, the kernel argument block (b12x_kernels.interface.MmaArgs) packed once per configuration, a call
allocates only its output and launches one kernel. Fused qkv / gate_up shards whose layouts concatenate
(layout.merge_blocker) are one MmaShard over all rows, each shard's per-tensor factor carried per row
(`row_scale`); the others launch one kernel per shard. Its configuration (MmaConfig: token tile, K splits, CTA height,
held activations) is an argument: tensor_core.configure chooses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

import b12x_formats as bf
from b12x_formats.kernel_facts import format_id
from b12x_formats.quantized import codec_for

from .. import kernels, pdl
from . import layout
from .geometry import TILE_ROWS, output_tiles, token_tiles


@dataclass
class MmaShard:
    format: str
    fmt_id: int
    row: int  # first output row of the shard
    n: int
    k: int
    chunks: int
    codes: torch.Tensor
    meta: torch.Tensor | None
    meta2: torch.Tensor | None
    block_scale: torch.Tensor | None
    tables: torch.Tensor | None
    alpha: float
    scale_mul: float = 1.0
    row_scale: torch.Tensor | None = None  # float32 [n]: each row's factor, times alpha (merged shards: alpha is 1)
    pdl: int = 0  # launch with programmatic dependent launch (b12x_core.pdl: B12X_PDL=1, read by prepare)
    packed: dict = field(default_factory=dict, repr=False)  # the kernel's argument blocks, by launch (args())

    def args(self, config: MmaConfig, ldy: int, epilogue: str = "bf16", row_scale: torch.Tensor | None = None,
             top_k: int = 0, x_quant: str = "none", x_quant_scale: float = 0.0) -> bytes:  # fmt: skip
        """The kernel's argument block for this shard under `config` (b12x_kernels.interface.MmaArgs): packed on
        first use, then reused, so a call passes only its activations, output, token count and workspace.
        `row_scale`: float32 per-row factors, by default the shard's own. `x_quant` (resident configurations only;
        b12x_kernels.interface.X_QUANTS: "fp8_static" for FP8, "mxfp8" for MXFP8 / MXFP4 / NVFP4, "nvfp4" for
        NVFP4): the kernel quantizes x as that activation mode where it holds it, the values the operand pass
        (b12x_kernels.act_quant) would otherwise write first; `x_quant_scale` is fp8 static's scale or nvfp4's
        global scale (float32 1 / input_scale). Per-tensor factors stay the caller's, as with the operand pass."""
        row_scale = self.row_scale if row_scale is None else row_scale
        key = (config, ldy, epilogue, device_ptr(row_scale), top_k, x_quant, x_quant_scale)
        if key not in self.packed:
            interface = kernels.interface
            self.packed[key] = interface.pack(
                interface.MmaArgs, format=self.fmt_id, codes=self.codes.data_ptr(), meta=device_ptr(self.meta),
                meta2=device_ptr(self.meta2), block_scale=device_ptr(self.block_scale),
                tables=device_ptr(self.tables), row_scale=device_ptr(row_scale), alpha=self.alpha,
                scale_mul=self.scale_mul, ldy=ldy, N=self.n, K=self.k,
                chunks=self.chunks, mt=config.mt, rt=config.rt, splits=min(config.splits, self.chunks),
                tiles=config.tiles, epilogue=interface.EPILOGUES.index(epilogue), top_k=top_k, pdl=self.pdl,
                resident=int(config.resident), x_quant=interface.X_QUANTS.index(x_quant), x_quant_scale=x_quant_scale,
            )  # fmt: skip
        return self.packed[key]


@dataclass(frozen=True)
class MmaConfig:
    mt: int  # token tile of 8·mt tokens
    splits: int  # K splits (deterministic in-order reduction when > 1)
    rt: int = 1  # row tiles of 16 per warp: each activation fragment feeds rt tiles
    # row tiles of 16 per CTA: 8, or 6 / 7 at one-token tiles of one row tile a warp (configure.balanced_config)
    tiles: int = 8
    # One-token tiles of one row tile a warp, dense: the split's activations held whole in shared memory, no CTA barrier
    # a stage (csrc/mma_gemm.cuh, resident_row_elems). configure.default_config sets it where it was measured faster
    # (configure.holds_resident).
    resident: bool = False

    @classmethod
    def of_plan_row(cls, config: dict) -> MmaConfig:
        """The configuration a linear's plan row holds ({"tokens", "splits", "rows"}: tokens a tile, K splits, rows a
        CTA; rows absent: 128)."""
        return cls(config["tokens"] // 8, config["splits"], tiles=config.get("rows", TILE_ROWS * 8) // TILE_ROWS,
                   resident=config.get("resident", False))  # fmt: skip

    def plan_row(self) -> dict:
        """This configuration as a plan row's config (of_plan_row's inverse; rows only where not 128, resident only
        where set)."""
        rows = {"rows": TILE_ROWS * self.tiles} if self.tiles != 8 else {}
        return {"tokens": 8 * self.mt, "splits": self.splits, **rows, **({"resident": True} if self.resident else {})}

    def __str__(self) -> str:
        rows = f", {16 * self.tiles} rows/CTA" if self.tiles != 8 else ""
        resident = ", resident activations" if self.resident else ""
        return f"{8 * self.mt} tokens × {16 * self.rt} rows/warp, {self.splits} K splits{rows}{resident}"


def _upload(a: np.ndarray | None, device) -> torch.Tensor | None:
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(device)


def prepare(shards: list[bf.QuantizedWeight], device, act_factor: float = 1.0, merge: bool = True) -> list[MmaShard]:
    """Repack and upload a weight's row shards; `act_factor` (a per-tensor activation scale the caller leaves out of
    the activations) joins every shard's factor. Shards whose layouts concatenate (layout.merge_blocker) become one
    MmaShard over all their rows, concatenated on the host before the upload, so a call launches one kernel: each
    shard's factor (alpha) then multiplies its rows through `row_scale` (alpha 1; (v·1)·a is v·a exactly), or stays
    alpha where every shard has the same. `merge=False`, or shards that cannot merge: one MmaShard per shard."""
    packed = [layout.pack(qw) for qw in shards]
    if merge and len(packed) > 1:
        packed = layout.share_scale_mul(packed)  # one scale_mul where the decodes stay exact: the shards can merge
    alphas = [mw.alpha * act_factor for mw in packed]
    row_scale = None
    if merge and len(packed) > 1 and layout.merge_blocker(packed) is None:
        factors = np.repeat(np.asarray(alphas, dtype=np.float32), [mw.n for mw in packed])  # as the plan rounds alpha
        packed = [layout.concat_rows(packed)]  # the shards' own arrays go with the list
        if len(np.unique(factors)) == 1:
            alphas = alphas[:1]
        else:
            alphas, row_scale = [1.0], _upload(factors, device)
    tables = None
    if codec_for(packed[0].format).grid is not None:  # IQ2: the kernel reads its grid
        tables = _upload(layout.iq2_tables(packed[0].format).view(np.int32), device)
    out, row = [], 0
    for mw, alpha in zip(packed, alphas, strict=True):
        out.append(
            MmaShard(
                mw.format, format_id(mw.format), row, mw.n, mw.k, mw.chunks,
                _upload(mw.codes, device), _upload(mw.meta, device), _upload(mw.meta2, device),
                _upload(mw.block_scale, device), tables, alpha, mw.scale_mul, row_scale, pdl.enabled(),
            )
        )  # fmt: skip
        row += mw.n
    return out


@dataclass
class MmaWorkspace:
    """Split-K partials and the per-tile tickets (zero at rest; the kernel leaves them zero)."""

    partials: torch.Tensor
    tickets: torch.Tensor

    @classmethod
    def create(cls, m: int, n: int, splits: int, mt: int, device, row_tiles: int = 8) -> MmaWorkspace:
        """`row_tiles`: the configuration's row tiles a CTA (MmaConfig.tiles), which sets the output tiles."""
        tiles = output_tiles(token_tiles(m, mt), n, TILE_ROWS * row_tiles)
        return cls(
            torch.empty(splits * m * n if splits > 1 else 1, dtype=torch.float32, device=device),
            torch.zeros(max(tiles, 1), dtype=torch.int32, device=device),
        )


def device_ptr(t: torch.Tensor | None) -> int:
    """A tensor's device address; 0 (the kernels' null) for none."""
    return 0 if t is None else t.data_ptr()


def launch(args: bytes, x: torch.Tensor, y: torch.Tensor | None, m: int, workspace: MmaWorkspace | None,
           stream: int, bias: torch.Tensor | None = None, table: tuple = (), routed: tuple = (),
           combine_w: torch.Tensor | None = None) -> None:  # fmt: skip
    """One kernel launch of a shard's `args` (MmaShard.args): m rows of x (bf16, row stride K) into y. The grouped
    form takes either `table`, (order, block table [3, blocks]) from b12x_core.moe_blocks, or `routed`, (ids int32
    [m], experts, blocks): each CTA finds its table block itself. `combine_w` (fp32 [m / k, k], the f32 epilogue,
    grouped): y bf16 [m / k, N] is the combine of the float32 slot rows (csrc/kernels.h MmaCall)."""
    grouped = {}
    if table:
        order, blocks = table
        grouped = dict(order=order.data_ptr(), table=blocks.data_ptr(), blocks=blocks.shape[1])
    if routed:
        ids, experts, blocks = routed
        grouped = dict(ids=ids.data_ptr(), experts=experts, blocks=blocks)
    if combine_w is not None:
        grouped.update(combine_w=combine_w.data_ptr(), combine_k=combine_w.shape[1])
    kernels.mma_gemm(
        args, x.data_ptr(), device_ptr(bias), device_ptr(y), m,
        0 if workspace is None else workspace.partials.data_ptr(),
        0 if workspace is None else workspace.tickets.data_ptr(), stream, **grouped,
    )  # fmt: skip


def run(x2: torch.Tensor, shards: list[MmaShard], y: torch.Tensor, bias: torch.Tensor | None, config: MmaConfig,
        workspace: MmaWorkspace | None, stream: int, x_quant: str = "none",
        x_quant_scale: float = 0.0) -> None:  # fmt: skip
    """y[:, shard rows] = x2 @ W.T (+ bias) for every shard; x2 bf16 [M, K] contiguous, y bf16 [M, N].
    `x_quant`: x2 quantized as that activation mode inside the kernel (MmaShard.args; resident configurations of the
    formats that pair with it, the extension refuses others); the plans pass it where the row says so
    (configure.quantizes_in_kernel)."""
    m = x2.shape[0]
    for s in shards:
        args = s.args(config, y.shape[1], x_quant=x_quant, x_quant_scale=x_quant_scale)
        launch(args, x2, y[:, s.row :], m, workspace, stream, None if bias is None else bias[s.row :])
