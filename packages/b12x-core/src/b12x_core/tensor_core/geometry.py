"""The tensor-core GEMM's geometry as b12x_core counts with it: the kernel's own numbers (rows per CTA, K per
chunk, token tiles, CTA heights) come from b12x_kernels.interface, the module csrc/interface.h is generated from; the
counts made of them (output tiles, split-K tickets, CTAs that run at once, what fits a device's shared memory a block)
are here, once. It chooses nothing: the rules that pick a configuration from these counts are tensor_core/configure.py.
"""

from __future__ import annotations

import torch

from b12x_formats.kernel_facts import format_id

from .. import kernels
from ..kernels import interface

MMA = interface.MMA  # the family's capability model
LANE_BYTES, QUAD = interface.LANE_BYTES, interface.QUAD
TILE_ROWS, ROWS_PER_CTA = interface.TILE_ROWS, interface.ROWS_PER_CTA
TOKEN_TILES, chunk_k = MMA.token_tiles, interface.chunk_k

CONSERVATIVE_BLOCKS_PER_SM = 2  # plans worked out without the kernel at hand (previews, CPU machines)

# The kernel's static __shared__ arrays (its row maps, warp sums and flags: about 300 bytes) count against the same
# per-block limit as the dynamic shared memory b12x_kernels.mma_smem_bytes gives.
STATIC_SMEM_BOUND = 1024
CTA_HEIGHTS = MMA.cta_heights  # tallest first: 128 rows, or 112 / 96 at one-token tiles of one row tile a warp
FULL_HEIGHT = CTA_HEIGHTS[0]  # row tiles of a 128-row CTA (every grouped CTA, every token tile past 8)

__all__ = ["CONSERVATIVE_BLOCKS_PER_SM", "CTA_HEIGHTS", "FULL_HEIGHT", "LANE_BYTES", "MMA", "QUAD", "ROWS_PER_CTA",
           "STATIC_SMEM_BOUND", "TILE_ROWS", "TOKEN_TILES", "chunk_k", "fits", "fitting_heights", "kernels_run",
           "concurrent_ctas", "output_tiles", "concurrent_ctas_here", "smem_bytes", "smem_limit", "smem_reason",
           "split_tickets", "token_tiles"]  # fmt: skip


def token_tiles(m: int, mt: int) -> int:
    """Token tiles of 8·mt tokens that cover m tokens."""
    return -(-m // (8 * mt))


def output_tiles(token_blocks: int, n: int, rows_per_cta: int = ROWS_PER_CTA) -> int:
    """Output tiles (one CTA's work per K split) of `token_blocks` token tiles × n weight rows; a split-K call
    takes one ticket per output tile."""
    return token_blocks * -(-n // rows_per_cta)


def split_tickets(n: int, rows) -> int:
    """Split-K tickets the largest call of a linear's plan rows ((first, last, config) with config["tokens"] per
    token tile, config["splits"] and config["rows"] a CTA, 128 where absent) takes: one per output tile of a call
    that splits K; at least 1."""
    return max([1] + [output_tiles(token_tiles(last, config["tokens"] // 8), n, config.get("rows", ROWS_PER_CTA))
                      for _, last, config in rows if config["splits"] > 1])  # fmt: skip


def kernels_run(query) -> bool:
    """Whether the query's device is a CUDA device whose kernels are built: their own counts (occupancy, shared memory
    a block) then hold for its plans."""
    return query.on_cuda and not query.device.kernels


def concurrent_ctas(query, fmt: str, mt: int, tiles: int = FULL_HEIGHT) -> int:
    """CTAs of the tensor-core GEMM (format, token tile of 8·mt, `tiles` row tiles a CTA) that run at once on the
    query's device: SMs × CTAs per SM, from the kernel's occupancy where it is at hand, else a conservative guess
    (also where that kernel does not fit the device: the extension answers 0)."""
    blocks = CONSERVATIVE_BLOCKS_PER_SM
    if kernels_run(query):
        blocks = kernels.mma_blocks_per_sm(format_id(fmt), mt, 1, tiles) or blocks
    return query.device.sms * blocks


def concurrent_ctas_here(fmt: str, mt: int, device, rt: int = 1) -> int:
    """CTAs that run at once on a CUDA device here (the benchmarks' count; a plan's is concurrent_ctas): SMs × the
    kernel's CTAs per SM (occupancy of that format and token tile)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return sms * max(1, kernels.mma_blocks_per_sm(format_id(fmt), mt, rt))


def smem_limit(query) -> int:
    """Bytes of shared memory one CTA may take on the query's CUDA device (its opt-in limit per block: 227 KB on
    SM90, 99 KB on SM12x); 0 where no CUDA kernel runs (nothing to keep within)."""
    return query.device.smem_kb * 1024 if kernels_run(query) else 0


def smem_bytes(fmt: str, mt: int, tiles: int = FULL_HEIGHT, resident_rows: int = 0,
               chunks_per_split: int = 0) -> int | None:  # fmt: skip
    """The shared memory one CTA of the kernel for (format, token tile 8·mt, `tiles` row tiles; rows held over the
    split's K where resident_rows) takes, static bound included; 0: no such kernel; None: the kernels are not at
    hand to say (b12x_kernels without its extension)."""
    if not kernels.built():
        return None
    need = kernels.mma_smem_bytes(format_id(fmt), mt, tiles, resident_rows, chunks_per_split)
    return need + STATIC_SMEM_BOUND if need else 0


def fits(fmt: str, mt: int, tiles: int, limit: int, resident_rows: int = 0, chunks_per_split: int = 0) -> bool:
    """Whether that CTA runs within `limit` bytes a block (limit 0, or kernels not at hand: nothing to check)."""
    if not limit or not fmt:
        return True
    need = smem_bytes(fmt, mt, tiles, resident_rows, chunks_per_split)
    return need is None or 0 < need <= limit


def fitting_heights(fmt: str, limit: int) -> tuple[int, ...]:
    """The CTA heights (CTA_HEIGHTS) whose one-token CTA fits `limit`: all three on SM90; on SM12x IQ2_XS's grid
    and sign tables leave room for 7 or 6 row tiles only. Empty: no form of the kernel fits."""
    return tuple(t for t in CTA_HEIGHTS if fits(fmt, 1, t, limit))


def smem_reason(query, fmt: str, tiles: int) -> str:
    """Why no CTA of the tensor-core GEMM for `fmt` fits the query's device's shared memory a block, at its smallest
    form (one-token tiles, `tiles` row tiles: the dense GEMM's shortest CTA, the grouped GEMM's 128-row one), or ""."""
    limit = smem_limit(query)
    if fits(fmt, 1, tiles, limit):
        return ""
    need = smem_bytes(fmt, 1, tiles)
    return (f"a CTA of its {fmt} kernel takes {need / 1024:.1f} KB of shared memory at the least (one-token tiles, "
            f"{TILE_ROWS * tiles} rows), this GPU allows {query.device.smem_kb} KB a block")  # fmt: skip
