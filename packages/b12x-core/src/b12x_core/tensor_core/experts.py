"""An MoE's expert stack in the tensor-core GEMM's layout (b12x_kernels.mma_gemm, grouped): every expert's rows
of every shard stacked into one [E·R, K] weight, repacked once by tensor_core.layout (lossless), with each row's
per-tensor factor (NVFP4's per-expert weight_scale_2, a static activation scale) moved into a float32 row
factor, so experts and shards with different per-tensor scales share one launch.

Gated SiLU interleaves each expert's gate and up rows 8 by 8 (16-row tile i = gate rows 8i..8i+7, then up rows
8i..8i+7): the kernel's lane then holds gate and up of the same intermediate column (MMA accumulator rows q and
q + 8) and applies silu(gate)·up in its epilogue, whatever the checkpoint's w13 order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import b12x_formats as bf

from ..weights import mma_activation_factor, scale_names, weight_row_factors
from . import gemm

GATE_UP_ROWS = 8  # rows of gate, then of up, per 16-row tile


def rows13(shape) -> int:
    """Rows of one expert's w13 stack (the gate/up GEMM's N) for an MoEShape: gate and up (2I) for gated SiLU, I for
    ReLU²."""
    return 2 * shape.intermediate if shape.activation == "silu" else shape.intermediate


def interleave_gate_up(inter: int, gate_first: bool) -> np.ndarray:
    """Row order of one expert's [2I] w13 rows for the fused SiLU epilogue: position p holds stacked row
    order[p]; tile i holds gate rows 8i..8i+7 then up rows 8i..8i+7."""
    if inter % GATE_UP_ROWS:
        raise ValueError(f"interleaving gate and up rows needs I % {GATE_UP_ROWS} == 0, I is {inter}")
    gate0, up0 = (0, inter) if gate_first else (inter, 0)
    blocks = np.arange(inter).reshape(-1, GATE_UP_ROWS)
    return np.concatenate([gate0 + blocks, up0 + blocks], axis=1).reshape(-1)


@dataclass
class MmaExperts:
    """The stacked experts on the device: one MmaShard whose `n` is the rows of one expert (the grouped GEMM's
    N; its codes hold every expert), and the row factors."""

    shard: gemm.MmaShard
    row_scale: torch.Tensor  # float32 [E·rows]: per-tensor factors × act factor × the layout's alpha


def stack_rows(shards: list[bf.QuantizedWeight], order: np.ndarray | None = None):
    """Shards [E, n_i, K] -> (one 2-D QuantizedWeight [E·R, K] whose per-tensor factor is 1, float32 factor per
    row [E·R]); rows of each expert in shard order, then permuted by `order` (R entries) when given."""
    fmt = shards[0].format
    experts, k = int(np.prod(shards[0].shape[:-2])), shards[0].shape[-1]
    rows = sum(p.shape[-2] for p in shards)
    block, factor = scale_names(fmt)
    perm = np.arange(rows) if order is None else np.asarray(order)
    if sorted(perm.tolist()) != list(range(rows)):
        raise ValueError(f"row order must permute the {rows} rows of an expert")

    def stacked(name: str) -> np.ndarray:  # tensors are [E, n, ...]: rows of every shard, per expert
        whole = np.concatenate([np.asarray(p.tensors[name]) for p in shards], axis=1)[:, perm]
        return np.ascontiguousarray(whole.reshape(experts * rows, *whole.shape[2:]))

    tensors = {"weight": stacked("weight")}
    if block is not None:
        tensors[block] = stacked(block)
    if factor is not None and factor in shards[0].tensors:  # moved into the row factors
        tensors[factor] = np.ones((), np.float32)
    factors = weight_row_factors(shards)[:, perm]
    return bf.QuantizedWeight(fmt, (experts * rows, k), tensors), factors.reshape(-1).astype(np.float32)


def prepare(shards: list[bf.QuantizedWeight], device, act_factor: float = 1.0, order=None) -> MmaExperts:
    """Stack, repack and upload an expert weight (see stack_rows); `act_factor` joins every row's factor."""
    whole, factors = stack_rows(shards, order)
    (shard,) = gemm.prepare([whole], device)
    row_scale = factors * np.float32(act_factor) * np.float32(shard.alpha)
    shard.alpha = 1.0  # carried per row
    shard.n = whole.shape[0] // int(np.prod(shards[0].shape[:-2]))  # the grouped GEMM's N: one expert's rows
    return MmaExperts(shard, torch.from_numpy(np.ascontiguousarray(row_scale, dtype=np.float32)).to(device))


def of(weights, order: np.ndarray | None = None) -> MmaExperts:
    """The expert stack of a prepared MoE weight (weights.DeviceWeights, in its activation mode), `order` as in
    stack_rows: made once and then shared, so both tensor-core MoE backends of a plan (the mma.sync and the wgmma
    grouped forms) read one copy."""
    key = ("mma_experts", None if order is None else tuple(np.asarray(order).tolist()))
    factor = mma_activation_factor(weights.act_mode, weights.input_scale)
    return weights.shared(key, lambda: prepare(weights.shards, weights.device, factor, order))
