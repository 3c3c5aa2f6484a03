"""The tensor-core mixed-input GEMM (b12x_kernels.mma_gemm) for a linear's row shards: weights repacked once by
tensor_core.layout, the kernel argument block (b12x_kernels.interface.MmaPlan) packed once per configuration, a call
allocates only its output and launches one kernel. Fused qkv / gate_up shards whose layouts concatenate
(layout.merge_blocker) are one MmaShard over all rows, each shard's per-tensor factor carried per row
(`row_scale`); the others launch one kernel per shard. Its configuration (token tile, K splits) is an argument: the
caller chooses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

import b12x_formats as bf
from b12x_formats.kernel_facts import format_id
from b12x_formats.quantized import codec_for

from .. import kernels, pdl
from . import geometry, layout
from .geometry import TILE_ROWS, chunk_k, output_tiles, token_tile, token_tiles

FULL_WAVES = 4  # from this many waves of CTAs on, K is not split


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
    plans: dict = field(default_factory=dict, repr=False)  # the kernel's argument blocks, by launch (plan())

    def plan(self, config: MmaConfig, ldy: int, epilogue: str = "bf16", row_scale: torch.Tensor | None = None,
             top_k: int = 0, x_quant: str = "none", x_quant_scale: float = 0.0) -> bytes:  # fmt: skip
        """The kernel's argument block for this shard under `config` (b12x_kernels.interface.MmaPlan): packed on
        first use, then reused, so a call passes only its activations, output, token count and workspace.
        `row_scale`: float32 per-row factors, by default the shard's own. `x_quant` (resident configurations only;
        b12x_kernels.interface.X_QUANTS: "fp8_static" for FP8, "mxfp8" for MXFP8 / MXFP4 / NVFP4, "nvfp4" for
        NVFP4): the kernel quantizes x as that activation mode where it holds it, the values the operand pass
        (b12x_kernels.act_quant) would otherwise write first; `x_quant_scale` is fp8 static's scale or nvfp4's
        global scale (float32 1 / input_scale). Per-tensor factors stay the caller's, as with the operand pass."""
        row_scale = self.row_scale if row_scale is None else row_scale
        key = (config, ldy, epilogue, device_ptr(row_scale), top_k, x_quant, x_quant_scale)
        if key not in self.plans:
            interface = kernels.interface
            self.plans[key] = interface.pack(
                interface.MmaPlan, format=self.fmt_id, codes=self.codes.data_ptr(), meta=device_ptr(self.meta),
                meta2=device_ptr(self.meta2), block_scale=device_ptr(self.block_scale),
                tables=device_ptr(self.tables), row_scale=device_ptr(row_scale), alpha=self.alpha,
                scale_mul=self.scale_mul, ldy=ldy, N=self.n, K=self.k,
                chunks=self.chunks, mt=config.mt, rt=config.rt, splits=min(config.splits, self.chunks),
                tiles=config.tiles, epilogue=interface.EPILOGUES.index(epilogue), top_k=top_k, pdl=self.pdl,
                resident=int(config.resident), x_quant=interface.X_QUANTS.index(x_quant), x_quant_scale=x_quant_scale,
            )  # fmt: skip
        return self.plans[key]


@dataclass(frozen=True)
class MmaConfig:
    mt: int  # token tile of 8·mt tokens
    splits: int  # K splits (deterministic in-order reduction when > 1)
    rt: int = 1  # row tiles of 16 per warp: each activation fragment feeds rt tiles
    tiles: int = 8  # row tiles of 16 per CTA: 8, or 6 / 7 at one-token tiles of one row tile a warp (balanced_config)
    # One-token tiles of one row tile a warp, dense: the split's activations held whole in shared memory, no CTA barrier
    # a stage (csrc/mma_gemm.cuh, resident_row_elems). default_config sets it where it was measured faster
    # (holds_resident).
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


# At one-token tiles (mt = 1) each CTA streams its weights latency-bound, so two CTAs an SM read as fast as the
# kernel's full occupancy (3-4) does, and each further K split only adds partials to write and sum: on the 8B
# linears at 1 and 4 tokens the best splits filled about two CTAs an SM, faster than filling the occupancy.
# `python benchmarks/mma_linear.py --model 8b --ms 1,4 --sweep` times every split beside the default.
STREAMING_CTAS_PER_SM = 2


def default_config(m: int, n: int, chunks: int, slots: int, max_splits: int = 16, rt: int = 1,
                   sms: int = 0, share: float = 0.0, balance: bool = True, fmt: str = "",
                   act_mode: str = "bf16", smem_limit: int = 0) -> MmaConfig:  # fmt: skip
    """The token tile that covers M in the fewest tiles, and the K split that fills the GPU: its `slots` (SMs × CTAs
    per SM) in even waves (even_split, weighing each split's partials by `share`: split_share), or at one-token tiles,
    given the SMs, one wave of STREAMING_CTAS_PER_SM CTAs an SM: the CTA height and split that load the busiest SM
    least (balanced_config; every format measured faster with it) or, with `balance` False, 128-row CTAs split as
    far as the wave allows (streaming_split: what `mma_linear.py --balance-ab` times beside it). Given the format,
    one-token tiles hold their activations whole where the rule measured for it and `act_mode` allows
    (holds_resident). Given the format and the device's shared memory a block (`smem_limit`, bytes), every CTA fits
    it: smaller token tiles (geometry.fitting_token_tile) or shorter one-token CTAs (fitting_heights) where the
    usual ones would not launch (SM12x's 99 KB); `slots` must then be the chosen token tile's."""
    mt = geometry.fitting_token_tile(m, fmt, smem_limit)
    # no height fits: the backends' can_implement refuse the format first (geometry.smem_reason)
    heights = geometry.fitting_heights(fmt, smem_limit) or geometry.CTA_HEIGHTS
    height = heights[0] if mt == 1 else geometry.FULL_HEIGHT
    if height != geometry.FULL_HEIGHT:
        rt = 1  # shorter CTAs are one row tile a warp
    tiles = output_tiles(token_tiles(m, mt), n, TILE_ROWS * height)
    if m <= 8 and sms and rt == 1 and balance:  # one token tile: the one-token rules, measured there
        config = balanced_config(m, n, chunks, sms, max_splits, heights)
    elif m <= 8 and sms:
        config = MmaConfig(mt, streaming_split(tiles, chunks, sms, max_splits), rt, height)
    else:
        return MmaConfig(mt, even_split(tiles, chunks, slots, max_splits, share), rt, height)
    if holds_resident(fmt, m, chunks, config, act_mode, smem_limit):
        config = replace(config, resident=True)
    return config


# Resident activations (MmaConfig.resident): dead token rows read row 0 instead of a per-group select, and no CTA
# barrier a stage. At one token every format's linears ran as fast or faster resident than staged. At 2-8 tokens the
# gain shrinks and turns with the CTAs an SM holds, so only FP8 and MXFP8, whose decode is the lightest, keep them
# past one token. A quantized activation mode the kernel quantizes where it holds the rows (MMA.x_quant_formats) saves
# the operand pass only when held, so its pairs hold them at 2-8 tokens too. Held rows stay within what was measured:
# 4 tokens over a 4096-wide K, 32 KB. Re-measured by `python benchmarks/mma_linear.py --model 8b --per-linear
# --resident-ab` (staged against resident) and `--x-quant-ab` (operand pass against in-kernel quantization).
RESIDENT_FORMATS = frozenset({"FP8", "MXFP8"})  # resident at 2-8 tokens too
RESIDENT_MAX_BYTES = 4 * 4096 * 2


def holds_resident(fmt: str, m: int, chunks: int, config: MmaConfig, act_mode: str = "bf16",
                   smem_limit: int = 0) -> bool:  # fmt: skip
    """Whether a dense call of `m` tokens under `config` holds its activations whole: a one-token tile of one row
    tile a warp, at one token for every format and at up to 8 for RESIDENT_FORMATS and for the pairs the kernel
    quantizes (`act_mode` in MMA.x_quant_formats), its live rows over the split's K within RESIDENT_MAX_BYTES of bf16,
    and its CTA within the device's shared memory a block (`smem_limit` bytes; 0: not checked)."""
    past_one = fmt in RESIDENT_FORMATS or quantizes(fmt, act_mode)
    if not fmt or config.mt != 1 or config.rt != 1 or (m > 1 and not past_one):
        return False
    per_split = -(-chunks // config.splits)
    return held_rows_fit(fmt, m, chunks, config.splits) and geometry.fits(fmt, 1, config.tiles, smem_limit, min(m, 8),
                                                                          per_split)  # fmt: skip


def quantizes(fmt: str, act_mode: str) -> bool:
    """Whether `fmt`'s resident kernel quantizes `act_mode` activations itself (MMA.x_quant_formats)."""
    return fmt in geometry.MMA.x_quant_formats.get(act_mode, ())


def held_rows_fit(fmt: str, rows: int, chunks: int, splits: int) -> bool:
    """Whether a tile's held rows (`rows`, at most 8 a tile: tokens, or a block's slots) over one of `splits` K splits
    of `chunks` chunks stay within RESIDENT_MAX_BYTES of bf16 (the bytes measured)."""
    split_k = -(-chunks // splits) * chunk_k(fmt)
    return min(rows, 8) * split_k * 2 <= RESIDENT_MAX_BYTES


def balanced_config(m: int, n: int, chunks: int, sms: int, max_splits: int = 16,
                    heights: tuple[int, ...] = geometry.CTA_HEIGHTS) -> MmaConfig:  # fmt: skip
    """At one-token tiles, the CTA height (6, 7 or 8 row tiles) and K split that give the busiest SM the least work
    when one wave of STREAMING_CTAS_PER_SM CTAs an SM holds every CTA — row tiles × chunks on the SM with the most
    CTAs. 8B gate_up (1792 row tiles, 32 chunks, 132 SMs): 224 CTAs of 8 put 2 × 8 × 32 on the busiest SM, 256
    CTAs of 7 put 2 × 7 × 32. Every format ran faster so than with streaming_split's 128-row CTAs on the 8B and 70B
    layers at one and four tokens (`python benchmarks/mma_linear.py --ms 1,4 --balance-ab` re-measures it).
    `heights`: the CTA heights that fit the device (geometry.fitting_heights)."""
    mt = token_tile(m)
    if mt != 1:
        return MmaConfig(mt, 1)
    n16 = -(-n // 16)
    best = None
    for tiles in heights:
        blocks = -(-n16 // tiles)
        for splits in range(1, max(1, min(max_splits, chunks // 4)) + 1):
            ctas = blocks * splits
            if splits > 1 and ctas > STREAMING_CTAS_PER_SM * sms:
                break
            work = -(-ctas // sms) * tiles * -(-chunks // splits)
            key = (work, -(ctas // sms), -tiles)  # ties: more CTAs an SM (warps hide the decode's latencies)
            if best is None or key < best[0]:
                best = (key, MmaConfig(mt, splits, 1, tiles))
    return best[1]


def split_share(fmt: str, m: int, k: int) -> float:
    """What one more K split costs beside the weights: its fp32 partials of m rows (written, then read back by the
    reduction, 8 bytes an output) over the weight's bytes (K × bits per weight / 8 a row): independent of N; grows
    with the tokens: 0.44 at 128 tokens of a 4096-wide 4.5-bit linear, where four splits' partials cost a quarter of
    gate_up's time (`python benchmarks/mma_linear.py --model 8b --ms 128 --sweep` times each split)."""
    from b12x_formats.quantized import codec_for

    return 8.0 * m / (k * codec_for(fmt).spec.bits_per_weight / 8)


def streaming_split(tiles: int, chunks: int, sms: int, max_splits: int = 16) -> int:
    """The most K splits whose CTAs (`tiles` output tiles × splits) still fit one wave of STREAMING_CTAS_PER_SM
    CTAs an SM, each split keeping at least 4 chunks; 1 where the tiles alone fill it."""
    return max(1, min(max_splits, chunks // 4, STREAMING_CTAS_PER_SM * sms // tiles))


def even_split(tiles: int, chunks: int, slots: int, max_splits: int = 16, share: float = 0.0) -> int:
    """The K split whose CTAs (`tiles` output tiles × splits) fill the GPU's `slots` (SMs × CTAs per SM) in the
    most even waves: a last partial wave leaves SMs idle while it runs. Each split keeps at least 4 chunks;
    more splits cost a little (partials written and summed), so ties take fewer, and a split costs its partials'
    traffic as a share of the weight's (`share`, split_share: nothing at one token, half the weight's bytes a
    split at 128 tokens of a 4-bit linear); from FULL_WAVES waves on the tail is small and the partials' traffic
    (growing with the tokens) is not, so K stays whole. Costs are in units of the time of one even wave-filling pass
    over the weight."""
    if tiles >= FULL_WAVES * slots:
        return 1

    def cost(splits: int) -> float:
        waves = tiles * splits / slots
        return -(-waves // 1) / waves + 0.01 * splits + (share * splits if splits > 1 else 0.0)

    candidates = range(1, max(1, min(max_splits, chunks // 4)) + 1)
    return min(candidates, key=cost)


def slots(fmt: str, mt: int, device, rt: int = 1) -> int:
    """CTAs that run at once: SMs × the kernel's CTAs per SM (occupancy of that format and token tile)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return sms * max(1, kernels.mma_blocks_per_sm(format_id(fmt), mt, rt))


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


def launch(plan: bytes, x: torch.Tensor, y: torch.Tensor | None, m: int, workspace: MmaWorkspace | None,
           stream: int, bias: torch.Tensor | None = None, table: tuple = (), routed: tuple = (),
           combine_w: torch.Tensor | None = None) -> None:  # fmt: skip
    """One kernel launch of a shard's `plan` (MmaShard.plan): m rows of x (bf16, row stride K) into y. The grouped
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
        plan, x.data_ptr(), device_ptr(bias), device_ptr(y), m,
        0 if workspace is None else workspace.partials.data_ptr(),
        0 if workspace is None else workspace.tickets.data_ptr(), stream, **grouped,
    )  # fmt: skip


def run(x2: torch.Tensor, shards: list[MmaShard], y: torch.Tensor, bias: torch.Tensor | None, config: MmaConfig,
        workspace: MmaWorkspace | None, stream: int, x_quant: str = "none",
        x_quant_scale: float = 0.0) -> None:  # fmt: skip
    """y[:, shard rows] = x2 @ W.T (+ bias) for every shard; x2 bf16 [M, K] contiguous, y bf16 [M, N].
    `x_quant`: x2 quantized as that activation mode inside the kernel (MmaShard.plan; resident configurations of the
    formats that pair with it, the extension refuses others); the plans pass it where the row says so
    (backends.tensor_core.quantizes_in_kernel)."""
    m = x2.shape[0]
    for s in shards:
        plan = s.plan(config, y.shape[1], x_quant=x_quant, x_quant_scale=x_quant_scale)
        launch(plan, x2, y[:, s.row :], m, workspace, stream, None if bias is None else bias[s.row :])
