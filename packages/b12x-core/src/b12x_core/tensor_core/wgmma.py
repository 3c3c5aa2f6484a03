"""The Hopper (sm_90a) warpgroup-MMA prototype of the tensor-core GEMM (b12x_kernels.wgmma_gemm,
csrc/wgmma_gemm.cu): the same repacked weights as gemm.py's MmaShard, 8·nt tokens per CTA as the wgmma's N, K
whole, only the bf16 epilogue (bias optional). Not a backend and in no registry: tests and
benchmarks/wgmma_linear.py call it directly.
"""

from __future__ import annotations

import torch

from b12x_kernels.interface import WGMMA_FORMATS as FORMATS  # its decodes need no per-chunk fp32 scale
from b12x_kernels.interface import WGMMA_TOKEN_TILES as TOKEN_TILES  # nt: 8·nt tokens per CTA

from .gemm import MmaShard, device_ptr

__all__ = ["FORMATS", "TOKEN_TILES", "plan", "run", "token_tile"]


def plan(shard: MmaShard, nt: int, ldy: int) -> bytes:
    """The kernel's argument block (b12x_kernels.interface.WgmmaPlan) for `shard`, token tile 8·nt, output row
    stride ldy: packed on first use, then kept in the shard's plan cache."""
    key = ("wgmma", nt, ldy)
    if key not in shard.plans:
        from b12x_kernels import interface

        shard.plans[key] = interface.pack(
            interface.WgmmaPlan, format=shard.fmt_id, codes=shard.codes.data_ptr(), meta=device_ptr(shard.meta),
            meta2=device_ptr(shard.meta2), alpha=shard.alpha, scale_mul=shard.scale_mul, ldy=ldy, N=shard.n, K=shard.k,
            chunks=shard.chunks, nt=nt,
        )  # fmt: skip
    return shard.plans[key]


def token_tile(m: int) -> int:
    """The smallest nt whose tile (8·nt tokens) covers m, capped at the largest."""
    return next((nt for nt in TOKEN_TILES if 8 * nt >= m), TOKEN_TILES[-1])


def run(x2: torch.Tensor, shards: list[MmaShard], y: torch.Tensor, bias: torch.Tensor | None, nt: int,
        stream: int) -> None:  # fmt: skip
    """y[:, shard rows] = x2 @ W.T (+ bias) for every shard; x2 bf16 [M, K] contiguous, y bf16 [M, N]."""
    import b12x_kernels

    m = x2.shape[0]
    for s in shards:
        b12x_kernels.wgmma_gemm(
            plan(s, nt, y.shape[1]), x2.data_ptr(), 0 if bias is None else bias[s.row :].data_ptr(),
            y[:, s.row :].data_ptr(), m, stream,
        )  # fmt: skip
