"""The tensor-core GEMM's geometry, the one place b12x_core reads it from: how many weight rows a CTA covers, how
much K one chunk holds, the token tiles, and the counts made of them (output tiles, split-K tickets, CTAs that
run at once). The kernel (csrc/mma_gemm.cuh) is written for these values; a change here is a change there.
"""

from __future__ import annotations

import b12x_formats as bf

TILE_ROWS = 16  # weight rows of one 1 KB tile (the MMA's M)
LANE_BYTES = 16  # one 16-byte load per lane and row
QUAD = 4  # lanes sharing a row
ROWS_PER_CTA = 128  # csrc/mma_gemm.cu: 8 warps × 16 rows
TOKEN_TILES = (1, 2, 4)  # mt: 8·mt tokens per CTA
CONSERVATIVE_BLOCKS_PER_SM = 2  # plans worked out without the kernel at hand (previews, CPU machines)


def chunk_k(fmt: str) -> int:
    """K weights per chunk: one 16-byte load per lane, four lanes per row."""
    spec = bf.spec(fmt)
    if spec.packing == "ggml":
        return spec.group_size if spec.group_size >= 256 else QUAD * LANE_BYTES
    bits = 4 if spec.bits_per_weight < 8 else 8
    return QUAD * LANE_BYTES * 8 // bits


def token_tile(m: int) -> int:
    """mt of the token tile (8·mt tokens) that covers m tokens in the fewest tiles: 8, 16, then 32 per tile."""
    return 1 if m <= 8 else 2 if m <= 16 else 4


def token_tiles(m: int, mt: int) -> int:
    """Token tiles of 8·mt tokens that cover m tokens."""
    return -(-m // (8 * mt))


def output_tiles(token_blocks: int, n: int) -> int:
    """Output tiles (one CTA's work per K split) of `token_blocks` token tiles × n weight rows; a split-K call
    takes one ticket per output tile."""
    return token_blocks * -(-n // ROWS_PER_CTA)


def occupancy_slots(query, fmt: str, mt: int) -> int:
    """CTAs of the tensor-core GEMM (format, token tile of 8·mt) that run at once on the query's device: SMs ×
    CTAs per SM, from the kernel's occupancy where it is at hand, else a conservative guess."""
    blocks = CONSERVATIVE_BLOCKS_PER_SM
    if query.on_cuda and not query.device.kernels:
        import b12x_kernels
        from b12x_formats.kernel_facts import format_id

        blocks = b12x_kernels.mma_blocks_per_sm(format_id(fmt), mt, 1) or blocks
    return query.device.sms * blocks
