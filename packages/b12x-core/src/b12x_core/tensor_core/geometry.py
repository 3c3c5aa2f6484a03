"""The tensor-core GEMM's geometry as b12x_core counts with it: the kernel's own numbers (rows per CTA, K per
chunk, token tiles) come from b12x_kernels.interface, the module csrc/interface.h is generated from; the counts
made of them (output tiles, split-K tickets, CTAs that run at once) are here, once.
"""

from __future__ import annotations

from b12x_kernels.interface import LANE_BYTES, QUAD, ROWS_PER_CTA, TILE_ROWS, TOKEN_TILES, chunk_k

CONSERVATIVE_BLOCKS_PER_SM = 2  # plans worked out without the kernel at hand (previews, CPU machines)

__all__ = ["CONSERVATIVE_BLOCKS_PER_SM", "LANE_BYTES", "QUAD", "ROWS_PER_CTA", "TILE_ROWS", "TOKEN_TILES", "chunk_k",
           "occupancy_slots", "output_tiles", "split_tickets", "token_tile", "token_tiles"]  # fmt: skip


def token_tile(m: int) -> int:
    """mt of the token tile (8·mt tokens) that covers m tokens in the fewest tiles: 8, 16, then 32 per tile."""
    return 1 if m <= 8 else 2 if m <= 16 else 4


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


def occupancy_slots(query, fmt: str, mt: int) -> int:
    """CTAs of the tensor-core GEMM (format, token tile of 8·mt) that run at once on the query's device: SMs ×
    CTAs per SM, from the kernel's occupancy where it is at hand, else a conservative guess."""
    blocks = CONSERVATIVE_BLOCKS_PER_SM
    if query.on_cuda and not query.device.kernels:
        import b12x_kernels
        from b12x_formats.kernel_facts import format_id

        blocks = b12x_kernels.mma_blocks_per_sm(format_id(fmt), mt, 1) or blocks
    return query.device.sms * blocks
