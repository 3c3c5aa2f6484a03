"""Checkpoint tensors -> the device layouts backends read, made once per prepared op and shared between its
backends (`DeviceWeights`): a GEMV and the Triton tiles of one layer read the same stacked copy.

Every layout here is lossless: it holds the checkpoint's bytes (stacked along N, viewed as another dtype) plus
small tables (IQ2 grid and signs) and per-row float32 factors; the float32 dequantized weight exists only for
the reference. Which tensor is a block scale and which a per-tensor factor comes from the format's codec.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

import b12x_formats as bf
from b12x_formats import tables
from b12x_formats.kernel_facts import GGML
from b12x_formats.quantized import codec_for

# Activation modes whose per-tensor input_scale multiplies the product (the others carry no tensor factor).
TENSOR_ACTIVATION_SCALE = ("fp8_static", "nvfp4")


def as_shards(qw) -> list[bf.QuantizedWeight]:
    """A weight given whole or as row shards (fused qkv / gate_up, each with its own per-tensor scales)."""
    shards = [qw] if isinstance(qw, bf.QuantizedWeight) else list(qw)
    if not shards or not all(isinstance(p, bf.QuantizedWeight) for p in shards):
        raise ValueError("expected a b12x_formats.QuantizedWeight or a non-empty sequence of them (row shards)")
    first = shards[0]
    for p in shards[1:]:
        if p.format != first.format or tuple(p.shape[:-2]) != tuple(first.shape[:-2]) or p.shape[-1] != first.shape[-1]:
            raise ValueError(
                f"row shards must share format, leading dims and K: {first.format}{list(first.shape)} vs "
                f"{p.format}{list(p.shape)}"
            )
    return shards


def input_scale_of(qw: bf.QuantizedWeight | Sequence[bf.QuantizedWeight]) -> float | None:
    """The per-tensor activation scale. Expert stacks and fused shards share the largest, as one activation
    quantization feeds them all (vLLM does the same)."""
    scales = [p.tensors["input_scale"] for p in as_shards(qw) if "input_scale" in p.tensors]
    return float(max(np.max(s) for s in scales)) if scales else None


def dequantize_rows(shards: list[bf.QuantizedWeight], device) -> torch.Tensor:
    """Exact float32 weight of the shards stacked along N."""
    return torch.cat([torch.from_numpy(bf.dequantize(p)) for p in shards], dim=-2).to(device)


def checkpoint_tensor(a: np.ndarray) -> torch.Tensor:
    """A checkpoint array as a torch tensor of the same bytes (e4m3 as torch fp8, E8M0 as uint8)."""
    a = np.ascontiguousarray(a)
    if a.dtype.name == "float8_e4m3fn":
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    if a.dtype.name == "float8_e8m0fnu":
        return torch.from_numpy(a.view(np.uint8))
    return torch.from_numpy(a)


def scale_names(fmt: str) -> tuple[str | None, str | None]:
    """(block-scale tensor, per-tensor weight factor) of a format; None where it has none."""
    codec = codec_for(fmt)
    per_tensor = [n for n in codec.per_tensor_names() if n != "input_scale"]
    block = [n for n in codec.spec.required_tensors if n != "weight" and n not in per_tensor]
    return (block or [None])[0], (per_tensor or [None])[0]


def grid_table(fmt: str, device) -> torch.Tensor | None:
    """The IQ2 grid as llama.cpp's uint64 entries (int64 here), from the format's codec; None for formats without
    a grid."""
    grid = codec_for(fmt).grid
    if grid is None:
        return None
    return torch.from_numpy(tables.iq2_grid_u64(grid()).view(np.int64).copy()).to(device)


def _per_expert(t: dict, name: str | None, experts: int) -> np.ndarray:
    """A per-tensor factor (one scalar, or one per expert of a stack) as float32 [E]; ones when absent."""
    if name is None or name not in t:
        return np.ones(experts, np.float32)
    return np.broadcast_to(np.asarray(t[name], dtype=np.float32).reshape(-1), (experts,)).astype(np.float32)


@dataclass
class StackedWeight:
    """All row shards in one tensor set, as the Triton kernels read them (experts stacked by rows)."""

    weight: torch.Tensor  # checkpoint bytes of all shards, stacked along N (fp8 dtype for e4m3 weights)
    scales: torch.Tensor | None  # block scales stacked along N (FP8_BLOCK: float32 expanded to [N, ⌈K/128⌉])
    col_scale: torch.Tensor  # float32 [N]: per-tensor weight factors, times a per-tensor activation scale
    grid: torch.Tensor | None  # IQ2 grid (int64)
    signs: torch.Tensor | None  # IQ2 ksigns (uint8 [128])


def stack(shards, act_mode: str, input_scale: float | None, device) -> StackedWeight:
    """Row shards of one format (a fused qkv / gate_up, or one weight), whole or as expert stacks [E, n, ...]:
    expert e owns rows [e·R, (e+1)·R) of the stacked tensors, R the shards' rows in order (gate then up)."""
    fmt = shards[0].format
    lead = len(shards[0].shape) - 2
    experts = int(np.prod(shards[0].shape[:lead]))
    block, _ = scale_names(fmt)
    block_rows = bf.spec("FP8_BLOCK").group_size

    def stacked(name: str, expand_rows: int = 1) -> torch.Tensor:
        parts = []
        for p in shards:
            a = p.tensors[name]
            if expand_rows > 1:  # FP8_BLOCK: one row of block scales per output row, so any shard height stacks
                a = np.repeat(a, expand_rows, axis=lead)[(slice(None),) * lead + (slice(0, p.shape[-2]),)]
            t = checkpoint_tensor(a)
            parts.append(t.reshape(experts, p.shape[-2], *t.shape[lead + 1 :]))
        whole = torch.cat(parts, dim=1)
        return whole.reshape(-1, *whole.shape[2:]).contiguous().to(device)

    weight = stacked("weight")
    scales = None
    if block:
        scales = stacked(block, expand_rows=block_rows if fmt == "FP8_BLOCK" else 1)
        scales = scales.float() if fmt == "FP8_BLOCK" else scales
    col_scale = torch.from_numpy(row_factors(shards, act_mode, input_scale)).to(device)
    grid, signs = grid_table(fmt, device), sign_table(fmt, device)
    return StackedWeight(weight, scales, col_scale.to(torch.float32), grid, signs)


def activation_factor(act_mode: str, input_scale: float | None):
    """The per-tensor activation scale a mode leaves out of the activations (the weight's factors carry it), or
    1.0."""
    return input_scale if act_mode in TENSOR_ACTIVATION_SCALE else 1.0


def mma_activation_factor(act_mode: str, input_scale: float | None) -> float:
    """activation_factor as the tensor-core GEMM's layouts carry it: a float32 value, 1.0 where absent."""
    return float(np.float32(activation_factor(act_mode, input_scale) or 1.0))


def sign_table(fmt: str, device) -> torch.Tensor | None:
    """IQ2's ksigns (uint8 [128]), from b12x_formats; None for other formats (the grid formats, IQ2, are the ones
    whose sign bits index this table)."""
    return torch.from_numpy(tables.ksigns_iq2xs().copy()).to(device) if codec_for(fmt).grid is not None else None


def weight_row_factors(shards) -> np.ndarray:
    """float32 [E, rows of every shard]: each row's per-tensor weight factor (NVFP4's weight_scale_2, FP8's
    weight_scale: one per shard, or one per expert of a stack; ones where the format has none), rows of each
    expert in shard order. The one source of the row factors of the Triton stack and the tensor-core experts."""
    _, factor = scale_names(shards[0].format)
    experts = int(np.prod(shards[0].shape[: len(shards[0].shape) - 2]))
    return np.concatenate(
        [np.repeat(_per_expert(p.tensors, factor, experts)[:, None], p.shape[-2], axis=1) for p in shards], axis=1
    )


def row_factors(shards, act_mode: str, input_scale: float | None) -> np.ndarray:
    """float32 [rows of every shard (and expert)]: each row's per-tensor weight factor times a per-tensor
    activation scale the kernels leave out of the activations (what multiplies a row's dot products)."""
    col = weight_row_factors(shards)
    act_factor = activation_factor(act_mode, input_scale)
    return (torch.from_numpy(np.ascontiguousarray(col).reshape(-1)) * torch.tensor(act_factor)).numpy()


@dataclass
class ElementShard:
    """One row shard of an element-format weight, as the CUDA GEMV reads it."""

    weight: torch.Tensor  # uint8 view of the checkpoint bytes
    scales: torch.Tensor | None  # block scales (uint8 codes, or float32 [⌈n/128⌉, ⌈K/128⌉] for FP8_BLOCK)
    tensor_scale: float  # per-tensor weight factor times a per-tensor activation scale
    row: int  # first output row
    rows: int


def element_shards(shards, act_mode: str, input_scale: float | None, device, stacked: StackedWeight):
    """Each shard's tensors as row views of the stacked copy (one copy of the weight on the device); FP8_BLOCK's
    small unexpanded scale grid is uploaded per shard (the stacked copy holds it expanded per row)."""
    block, factor = scale_names(shards[0].format)
    act_factor = activation_factor(act_mode, input_scale)
    out, row = [], 0
    for p in shards:
        t = p.tensors
        rows = slice(row, row + p.shape[0])
        scales = None
        if block is not None and np.asarray(t[block]).dtype == np.float32:
            scales = torch.from_numpy(np.ascontiguousarray(t[block])).to(device)
        elif block is not None:
            scales = stacked.scales[rows].view(torch.uint8)
        weight_factor = 1.0 if factor is None else float(np.asarray(t[factor]).reshape(-1)[0])
        out.append(ElementShard(stacked.weight[rows].view(torch.uint8), scales, weight_factor * act_factor, row,
                                p.shape[0]))  # fmt: skip
        row += p.shape[0]
    return out


class DeviceWeights:
    """The device layouts of one prepared op's weight, each made on first use and then shared.

    `shared_layout`: set by the plan before its backends are prepared. "mma" when a chosen backend holds the
    tensor-core GEMM's repacked layout; backends that can read it (dequantize + cuBLAS) then do, so the weight
    is on the device once."""

    def __init__(self, shards: list[bf.QuantizedWeight], act_mode: str, input_scale: float | None, device):
        self.shards, self.act_mode, self.input_scale, self.device = shards, act_mode, input_scale, device
        self.format = shards[0].format
        self.shared_layout: str | None = None

    @functools.cached_property
    def mma(self) -> list:
        """The tensor-core GEMM's layout (tensor_core.gemm.prepare: one MmaShard over every row shard where they
        merge, else one per shard; per-tensor activation scales of the modes that leave them out of the activations
        are in each shard's factors, alpha or row_scale)."""
        from .tensor_core import gemm

        return gemm.prepare(self.shards, self.device, mma_activation_factor(self.act_mode, self.input_scale))

    def shared(self, key, make):
        """A layout that this class does not name (`make()`'s result), made on first use under `key` and then
        shared: every backend of the plan that asks for the same key reads one copy (tensor_core.experts.of)."""
        made = self.__dict__.setdefault("_shared", {})
        if key not in made:
            made[key] = make()
        return made[key]

    @functools.cached_property
    def row_factor(self) -> torch.Tensor:
        """float32 [N]: each row's per-tensor factor times the left-out activation scale (row_factors)."""
        return torch.from_numpy(row_factors(self.shards, self.act_mode, self.input_scale)).to(self.device)

    @functools.cached_property
    def stacked(self) -> StackedWeight:
        return stack(self.shards, self.act_mode, self.input_scale, self.device)

    @functools.cached_property
    def element_shards(self) -> list[ElementShard]:
        return element_shards(self.shards, self.act_mode, self.input_scale, self.device, self.stacked)

    @property
    def ggml_blocks(self) -> torch.Tensor:
        """Raw GGML blocks [N, K/group, block_bytes], the checkpoint bytes unchanged (the stacked copy)."""
        assert self.format in GGML, self.format
        return self.stacked.weight

    @functools.cached_property
    def block_scale_grid(self) -> torch.Tensor:
        """FP8_BLOCK's weight_scale_inv of every shard stacked along N, float32 [⌈N/128⌉, ⌈K/128⌉] (row shards of
        whole 128-row blocks only: the caller checks)."""
        grids = [np.asarray(p.tensors["weight_scale_inv"], dtype=np.float32) for p in self.shards]
        return torch.from_numpy(np.ascontiguousarray(np.concatenate(grids))).to(self.device)

    @functools.cached_property
    def dequantized(self) -> torch.Tensor:
        """The exact float32 weight [..., N, K] (the reference's operand)."""
        return dequantize_rows(self.shards, self.device)
