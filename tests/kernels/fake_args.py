"""Argument blocks for the extension's refusal tests: its checks run before any CUDA call, so an argument block whose
pointers are fake (aligned, non-null, never read) tests them on a machine without a GPU too."""

from __future__ import annotations

from b12x_formats.kernel_facts import format_id

FAKE = 16  # an aligned non-null address: the checks refuse before anything reads it


def mma_args(**fields) -> bytes:
    """A valid one-chunk NVFP4 MmaArgs (32 × 128, one token tile, one split) packed, with `fields` replacing its
    defaults (b12x_kernels.interface.MmaArgs's names)."""
    from b12x_kernels import interface

    base = dict(format=format_id("NVFP4"), codes=FAKE, meta=FAKE, meta2=0, block_scale=0, tables=0, row_scale=0,
                alpha=1.0, scale_mul=1.0, ldy=32, N=32, K=128, chunks=1, mt=1, rt=1, splits=1, tiles=8, epilogue=0,
                top_k=0, pdl=0, resident=0, x_quant=0, x_quant_scale=0.0)  # fmt: skip
    return interface.pack(interface.MmaArgs, **{**base, **fields})
