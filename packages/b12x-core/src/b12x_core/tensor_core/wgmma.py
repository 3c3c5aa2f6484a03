"""The Hopper (sm_90a) form of the tensor-core GEMM (b12x_kernels.wgmma_gemm, csrc/wgmma_gemm.cu): warpgroup MMAs
over gemm.py's repacked weights, under the same argument block (gemm.MmaShard.args: MmaArgs) with token tiles up to
128 tokens (wgmma's N; 64 for FACTOR_FORMATS, FP8_BLOCK and IQ2, whose per-chunk fp32 factor is folded into the
accumulators from a second set of partial sums), K split across CTAs with the same deterministic reduction. A call
stages its activations in the MMA's operand order first (scratch of `staged_bytes`), so it launches two kernels per
MmaShard (a fused linear's shards are one where they merge: gemm.prepare). The grouped form (`launch` with a block
table, token tiles of 32-128: `grouped_token_tile`) runs a fused MoE's GEMMs and equals the mma.sync grouped form on
the GPU; backend tensor_core_moe_wgmma drives it (chosen only where the measured MoE table has it faster).
Plans with tiles = WIDE_TILES (`wide_config`) run 256-row CTAs of four warpgroups (FP4 at 64- and 128-token tiles):
the plans' FP4 form from WIDE_FROM tokens on (default_config).
"""

from __future__ import annotations

import torch

from b12x_formats.kernel_facts import SAME_LAYOUT

from .. import kernels
from ..kernels import interface as _interface
from .configure import even_split
from .gemm import MmaConfig, MmaShard, MmaWorkspace, device_ptr
from .geometry import TILE_ROWS, chunk_k, output_tiles, token_tiles

FACTOR_FORMATS = _interface.WGMMA_FACTOR_FORMATS  # a per-chunk fp32 factor, folded
FACTOR_TOKEN_TILES = _interface.WGMMA_FACTOR_TOKEN_TILES  # theirs: up to 64 tokens
FORMATS = _interface.WGMMA_FORMATS  # its decodes need no per-chunk fp32 scale
GROUPED_FACTOR_FORMATS = _interface.WGMMA_GROUPED_FACTOR_FORMATS  # IQ2, grouped too
GROUPED_TOKEN_TILES = _interface.WGMMA_GROUPED_TOKEN_TILES  # the grouped form's
TOKEN_TILES = _interface.WGMMA_TOKEN_TILES  # mt: 8·mt tokens per CTA
WIDE_FORMATS = _interface.WGMMA_WIDE_FORMATS  # 256-row CTAs (wide_config)
WIDE_TILES = _interface.WGMMA_WIDE_TILES
WIDE_TOKEN_TILES = _interface.WGMMA_WIDE_TOKEN_TILES

__all__ = ["CAPABILITY", "FACTOR_FORMATS", "FACTOR_TOKEN_TILES", "FORMATS", "GROUPED_FORMATS", "GROUPED_TOKEN_TILES",
           "LINEAR_FORMATS", "TOKEN_TILES", "WIDE_FORMATS", "WIDE_FROM", "WIDE_TOKEN_TILES", "default_config",
           "grouped_token_tile", "grouped_token_tiles", "launch", "run", "concurrent_ctas", "staged_bytes",
           "token_tile", "token_tiles_of", "wide_config"]  # fmt: skip

CAPABILITY = (9, 0)  # wgmma is an sm_90a instruction: compute capability 9.0 exactly
# the dense form (rt = 1) runs both kinds, and the formats stored as one of them (W4A16_NVFP4 is NVFP4's tensors)
LINEAR_FORMATS = FORMATS + FACTOR_FORMATS + tuple(a for a, same in SAME_LAYOUT.items() if same in FORMATS)
_GROUPED = FORMATS + GROUPED_FACTOR_FORMATS
GROUPED_FORMATS = _GROUPED + tuple(a for a, same in SAME_LAYOUT.items() if same in _GROUPED)  # an MoE's expert stacks
CONSERVATIVE_BLOCKS = {1: 2, 2: 2, 4: 2, 8: 2, 16: 1}  # CTAs per SM by token tile (its launch bounds)


# The token tile per M, every tile timed on a Llama-3.1-8B layer (`python benchmarks/wgmma_linear.py` re-measures
# them). FP4 (128-wide K chunks): a tile covering M up to 16 tokens; then a tile of half to a quarter of M, whose more
# CTAs (and K splits) fill the SMs better than one tile's worth of wider wgmmas would; 128 tokens from 512 on.
# The 8-bit formats' 64-wide chunks hold half the multiplies for the same bookkeeping a chunk (copies, barriers,
# scales), and the kernel is issue-bound: 64-token tiles spread it over twice the tokens (FP8 and MXFP8 ran faster so
# at 32 and 64 tokens); Q8_0, whose decode costs more registers a weight, ran faster the other way round at 32 tokens.
# FP8_BLOCK and IQ2 (FACTOR_FORMATS) run tiles of up to 64 tokens (their partial accumulators take the registers of
# a larger one; past the table, token_tile falls back to that largest), and at 32 tokens ran fastest with Q8_0's
# rule's 32-token tiles.
TILE_UPTO_Q8 = ((8, 1), (16, 2), (32, 4), (256, 8))
TILE_UPTO = {
    "FP8": ((8, 1), (16, 2), (256, 8)),
    "MXFP8": ((8, 1), (16, 2), (256, 8)),
    "Q8_0": TILE_UPTO_Q8,
    **dict.fromkeys(FACTOR_FORMATS, TILE_UPTO_Q8),
}
TILE_UPTO_FP4 = ((8, 1), (16, 2), (64, 4), (256, 8))
# 256-row CTAs of 128-token tiles (wide_config) from here on, FP4 only: on the 8B layer they ran faster at 1024 and
# 4096 tokens than 128-row CTAs, but slower at 512 and below (four warps a scheduler hide the decode only where the
# tiles are many). `python benchmarks/wgmma_linear.py --wide --ms 256,512,1024,4096` re-measures it.
WIDE_FROM = 1024


def token_tiles_of(fmt: str) -> tuple[int, ...]:
    """The token tiles the dense form runs `fmt` at."""
    return FACTOR_TOKEN_TILES if fmt in FACTOR_FORMATS else TOKEN_TILES


def token_tile(m: int, fmt: str) -> int:
    """The token tile mt (8·mt tokens per CTA) for m tokens of `fmt`: TILE_UPTO's, else the largest."""
    return next((mt for upto, mt in TILE_UPTO.get(fmt, TILE_UPTO_FP4) if m <= upto), token_tiles_of(fmt)[-1])


def grouped_token_tiles(fmt: str) -> tuple[int, ...]:
    """The token tiles the grouped form runs `fmt` at (the factor formats' up to 64 slots a block)."""
    return tuple(mt for mt in GROUPED_TOKEN_TILES if mt in token_tiles_of(fmt))


def grouped_token_tile(per_expert: int, fmt: str) -> int:
    """The grouped form's token tile for `per_expert` slots an expert of `fmt`: the smallest block (32, 64, 128
    slots) that holds them, else the largest it runs. A block is one expert's, so a larger one than its slots only
    pads; below the largest it leaves the GPU more CTAs. Not measured yet: the MoE table times the backend."""
    tiles = grouped_token_tiles(fmt)
    return next((mt for mt in tiles if per_expert <= 8 * mt), tiles[-1])


def concurrent_ctas(fmt: str, mt: int, sms: int, measured: bool) -> int:
    """CTAs that run at once: SMs × CTAs per SM (the kernel's occupancy where `measured`, else its launch bounds)."""
    blocks = CONSERVATIVE_BLOCKS[mt]
    if measured:
        from b12x_formats.kernel_facts import format_id

        blocks = kernels.wgmma_blocks_per_sm(format_id(fmt), mt) or blocks
    return sms * blocks


def default_config(m: int, n: int, chunks: int, concurrent_ctas_of, mt: int | None = None, share: float = 0.0,
                   fmt: str = "NVFP4", sms: int | None = None) -> MmaConfig:  # fmt: skip
    """The token tile of `fmt` for M (token_tile; or the given mt), and the K split that fills the GPU
    (configure.even_split, each split's partials weighed by `share`: configure.split_share); `concurrent_ctas_of(mt)`
    gives the CTAs that run at once. Given the GPU's `sms` and no mt, from WIDE_FROM tokens on the FP4 formats run
    256-row CTAs (wide_config)."""
    if mt is None and sms and fmt in WIDE_FORMATS and m >= WIDE_FROM:
        return wide_config(m, n, chunks, sms, WIDE_TOKEN_TILES[-1], share)
    mt = mt or token_tile(m, fmt)
    return MmaConfig(mt, even_split(output_tiles(token_tiles(m, mt), n), chunks, concurrent_ctas_of(mt), share=share))


def wide_config(m: int, n: int, chunks: int, sms: int, mt: int, share: float = 0.0) -> MmaConfig:
    """The 256-row form (tiles = WIDE_TILES: four warpgroups a CTA, one CTA an SM; csrc/wgmma_gemm.cu) at token tile
    mt, with the K split that fills the GPU."""
    if mt not in WIDE_TOKEN_TILES:
        raise ValueError(f"the 256-row form's token tile is one of {WIDE_TOKEN_TILES}, not {mt}")
    rows = WIDE_TILES * TILE_ROWS
    return MmaConfig(mt, even_split(output_tiles(token_tiles(m, mt), n, rows), chunks, sms, share=share),
                     tiles=WIDE_TILES)  # fmt: skip


def staged_bytes(fmt: str, rows: int, k: int) -> int:
    """Scratch a call stages its activations in: whole groups of 8 rows × K padded to chunks, bf16; rows = the
    tokens, or for the grouped form the block table's blocks × 8·mt."""
    ck = chunk_k(fmt)
    return -(-rows // 8) * 8 * -(-k // ck) * ck * 2


def launch(args: bytes, x: torch.Tensor, y: torch.Tensor | None, m: int, workspace: MmaWorkspace,
           staged: torch.Tensor, stream: int, bias: torch.Tensor | None = None, table: tuple = ()) -> None:  # fmt: skip
    """One call of a shard's `args` (gemm.MmaShard.args): m rows of x into y, as gemm.launch; `table`: the grouped
    form's (order, block table [3, blocks]) from b12x_core.moe_blocks."""
    grouped = {}
    if table:
        order, blocks = table
        grouped = dict(order=order.data_ptr(), table=blocks.data_ptr(), blocks=blocks.shape[1])
    kernels.wgmma_gemm(
        args, x.data_ptr(), device_ptr(bias), device_ptr(y), m, workspace.partials.data_ptr(),
        workspace.tickets.data_ptr(), staged.data_ptr(), stream, **grouped,
    )  # fmt: skip


def run(x2: torch.Tensor, shards: list[MmaShard], y: torch.Tensor, bias: torch.Tensor | None, config: MmaConfig,
        workspace: MmaWorkspace, staged: torch.Tensor, stream: int) -> None:  # fmt: skip
    """y[:, shard rows] = x2 @ W.T (+ bias) for every shard; x2 bf16 [M, K] contiguous, y bf16 [M, N]; `staged`
    holds at least staged_bytes(format, M, K)."""
    m = x2.shape[0]
    for s in shards:
        launch(s.args(config, y.shape[1]), x2, y[:, s.row :], m, workspace, staged, stream,
               None if bias is None else bias[s.row :])  # fmt: skip
