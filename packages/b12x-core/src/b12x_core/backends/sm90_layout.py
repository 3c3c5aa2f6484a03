"""The Hopper CUTLASS family's weight copies ("sm90": the codes reordered so each thread's wgmma A fragment is one
load, csrc/sm90_mixed_layout.cuh; "sm90_checkpoint": the checkpoint's bytes) and their block-scale carriers:
what backends.cutlass_sm90 and backends.fragment_mma read, made once per weight (DeviceWeights.shared)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import kernels
from ..kernels import interface
from ..weights import stack
from .base import cuda_reason, sm90_mixed_reason

TILE_K = interface.SM90_MIXED_TILE_K


def reader_reason(q, family: interface.Family) -> str:
    """Why a backend of `family` that reads these copies cannot take the query beyond its formats ("" when it can):
    the bf16-exact activation modes, N and K in whole k-tiles, a CUDA device where the sm_90a kernels (the reorder
    among them) run."""
    if q.act_mode not in family.act_modes:
        return f"needs bf16-exact activations ({', '.join(family.act_modes)}), not {q.act_mode}"
    if q.n % TILE_K or q.k % TILE_K:
        return f"needs N and K multiples of {TILE_K}, got N={q.n}, K={q.k}"
    return cuda_reason(q, triton=q.act_mode != "bf16") or sm90_mixed_reason(q)


@dataclass
class Sm90Weight:
    """What sm90_mixed_gemm reads of one prepared linear."""

    codes: torch.Tensor  # uint8: the codes, reordered (sm90_mixed_reorder) or the checkpoint's K-major rows
    reordered: bool
    scales: torch.Tensor | None  # [K/64, N, 64/group]: each row's block scales over each k-tile (uint8; Q8_0 float16)
    row_factor: torch.Tensor  # float32 [N]: the per-tensor factors (and a left-out activation scale)


def tile_scales(block_scales: torch.Tensor, k: int) -> torch.Tensor:
    """Block scales [N, K/group] (row-major as checkpoints hold them; one byte each, Q8_0's d's two) -> [K/64, N,
    64/group]: one carrier of a row's scales per k-tile, N fastest, as the kernel's TMA reads them."""
    n, groups = block_scales.shape
    per_tile = groups * TILE_K // k
    return block_scales.reshape(n, k // TILE_K, per_tile).permute(1, 0, 2).contiguous()


def q8_0_split(blocks: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GGML Q8_0 blocks (uint8 [N, K/32, 34]: fp16 d, then 32 int8 q) -> (the q's as uint8 [N, K] bytes, the d's as
    float16 [N, K/32]): the codes the kernel reorders and the block scales its carrier holds."""
    if blocks.dtype != torch.uint8 or blocks.numel() != n * (k // 32) * 34 or k % 32:
        raise ValueError(f"Q8_0 blocks: expected uint8 with N x K/32 x 34 = {n} x {k // 32} x 34 bytes, got "
                         f"{blocks.dtype} {list(blocks.shape)}")  # fmt: skip
    blocks = blocks.reshape(n, k // 32, 34)
    deltas = blocks[..., :2].contiguous().view(torch.float16).reshape(n, k // 32)
    return blocks[..., 2:].contiguous().reshape(n, k), deltas


def reordered_weight(query, weights) -> Sm90Weight:
    """The "sm90" layout from the checkpoint shards (stacked on the device for the reorder, then dropped)."""
    q = query
    stacked = stack(weights.shards, weights.act_mode, weights.input_scale, q.device.device)
    if q.format == "Q8_0":
        src, deltas = q8_0_split(stacked.weight, q.n, q.k)
        scales = tile_scales(deltas, q.k)
    else:
        src = stacked.weight.view(torch.uint8)
        scales = None if stacked.scales is None else tile_scales(stacked.scales.view(torch.uint8), q.k)
    codes = torch.empty_like(src)
    stream = torch.cuda.current_stream(q.device.device).cuda_stream
    kernels.sm90_mixed_reorder(interface.SM90_MIXED_WEIGHTS[q.format], src.data_ptr(), codes.data_ptr(), q.n, q.k,
                               stream)  # fmt: skip
    return Sm90Weight(codes, True, scales, stacked.col_scale.contiguous())


def checkpoint_weight(query, weights) -> Sm90Weight:
    """The checkpoint layout's codes (shared with the other backends that read it) and the tile-layout scales."""
    stacked = weights.stacked
    scales = None if stacked.scales is None else tile_scales(stacked.scales.view(torch.uint8), query.k)
    return Sm90Weight(stacked.weight.view(torch.uint8), False, scales, stacked.col_scale.contiguous())
