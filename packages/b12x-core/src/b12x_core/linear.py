"""Dense linear layers: `prepare_linear` once, `linear` per call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

import b12x_formats as bf

from . import _registry
from ._checks import check_positive, check_tensor, check_tokens, refuse_during_capture, resolve_device
from .activations import quantize_activation
from .dispatch import Query, choose, tiles_run
from .errors import UnsupportedError

DEFAULT_MAX_TOKENS = 8192


def activation_mode(fmt: str, activation: str, has_input_scale: bool) -> str:
    """The activation quantization a format × activation pair runs with (see activations.py)."""
    spec = bf.spec(fmt)
    if activation not in spec.activations:
        raise UnsupportedError(f"{spec.name} weights run with activations {list(spec.activations)}, not {activation!r}")
    if activation == "bf16" or activation == "mxfp8":
        return activation
    if activation == "fp8":
        if spec.name == "FP8_BLOCK":
            return "fp8_group128"
        return "fp8_static" if has_input_scale else "fp8_token"
    if activation == "nvfp4":
        if not has_input_scale:
            raise UnsupportedError(f"{spec.name} with nvfp4 activations needs the checkpoint's input_scale")
        return "nvfp4"
    raise UnsupportedError(f"{spec.name}: unknown activation {activation!r}")


def input_scale_of(qw: bf.QuantizedWeight | Sequence[bf.QuantizedWeight]) -> float | None:
    """The per-tensor activation scale. Expert stacks and fused shards share the largest, as one activation
    quantization feeds them all (vLLM does the same)."""
    scales = [p.tensors["input_scale"] for p in as_shards(qw) if "input_scale" in p.tensors]
    return float(max(np.max(s) for s in scales)) if scales else None


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


def dequantize_rows(shards: list[bf.QuantizedWeight], device) -> torch.Tensor:
    """Exact float32 weight of the shards stacked along N."""
    return torch.cat([torch.from_numpy(bf.dequantize(p)) for p in shards], dim=-2).to(device)


@dataclass(eq=False)
class PreparedLinear:
    format: str
    activation: str  # as requested: bf16 | fp8 | mxfp8 | nvfp4
    act_mode: str  # the exact activation quantization (activations.MODES)
    n: int
    k: int
    max_tokens: int
    device: torch.device
    path: str
    weight: torch.Tensor | None = field(repr=False)  # reference: float32 [N, K], exactly dequantized
    input_scale: float | None = None
    blocks: torch.Tensor | None = field(default=None, repr=False)  # CUDA GGML: the checkpoint's blocks
    grid: torch.Tensor | None = field(default=None, repr=False)  # CUDA IQ2: grid table
    element_shards: list | None = field(default=None, repr=False)  # CUDA element formats: per-shard tensors
    tiles: object | None = field(default=None, repr=False)  # tile_path.TileWeight: the Triton prefill path
    tiles_from: int = 0  # calls with at least this many tokens run the tiles (when prepared)
    gemm_from: int = 1 << 62  # ... and from this many on, bf16-valued activations: decode + dense bf16 GEMM
    query: Query | None = None  # what dispatch was asked (explain() replays it)
    handle: int = 0

    def __repr__(self) -> str:
        path = self.path
        if self.tiles is not None and path != "triton_tiles":
            path += f" (M < {self.tiles_from}), triton_tiles (M >= {self.tiles_from})"
        if self.tiles is not None and self.gemm_from <= self.max_tokens:
            from .tile_path import dense_path, scaled_mm_path

            if dense_path(self):
                path += f", decode + bf16 GEMM (M >= {self.gemm_from})"
            elif scaled_mm_path(self):
                path += f", fp8 _scaled_mm (M >= {self.gemm_from})"
        return (
            f"PreparedLinear({self.format} × {self.activation} [{self.act_mode}], N={self.n}, K={self.k}, "
            f"max_tokens={self.max_tokens}, {self.device}, path={path})"
        )


def prepare_linear(
    qw: bf.QuantizedWeight | Sequence[bf.QuantizedWeight],
    device="cpu",
    max_tokens: int = DEFAULT_MAX_TOKENS,
    activation: str = "bf16",
    path: str = "auto",
) -> PreparedLinear:
    """Validate `qw`, choose the implementation for (format, activation, device) and upload what it needs.
    `qw` may also be a sequence of row shards of one format (a fused qkv or gate_up layer whose shards
    carry their own per-tensor scales); they run as one [sum N, K] layer."""
    refuse_during_capture("prepare_linear")
    if not isinstance(qw, (bf.QuantizedWeight, list, tuple)):
        raise ValueError(f"prepare_linear takes a b12x_formats.QuantizedWeight, got {type(qw).__name__}")
    shards = as_shards(qw)
    fmt = shards[0].format
    if len(shards[0].shape) != 2:
        raise UnsupportedError(f"{fmt}: linear weights are [N, K], got {list(shards[0].shape)}")
    check_positive("max_tokens", max_tokens)
    device = resolve_device(device)
    scale = input_scale_of(shards)
    mode = activation_mode(fmt, activation, scale is not None)
    query = Query("linear", fmt, activation, device, path, k=shards[0].shape[1])
    chosen = choose(query)
    n, k = sum(p.shape[0] for p in shards), shards[0].shape[1]
    lin = PreparedLinear(fmt, activation, mode, n, k, max_tokens, device, chosen, None, scale, query=query)
    if chosen in ("cuda_gemv_ggml", "cuda_gemv_elem", "triton_tiles") and tiles_run(query):
        from . import crossover, tile_path

        lin.tiles = tile_path.prepare_tiles(shards, mode, scale, device)
        lin.tiles_from = 0 if chosen == "triton_tiles" else crossover.tiles_from(fmt, device)
        lin.gemm_from = crossover.gemm_from(fmt, device)
    if chosen == "cuda_gemv_ggml":
        from .cuda_paths import grid_table

        # the source bytes, unchanged (shared with the tiles)
        lin.blocks = (
            lin.tiles.weight
            if lin.tiles is not None
            else torch.from_numpy(np.concatenate([p.tensors["weight"] for p in shards])).to(device)
        )
        lin.grid = grid_table(fmt, device)
    elif chosen == "cuda_gemv_elem":
        from .cuda_paths import element_shards

        lin.element_shards = element_shards(shards, device, stacked=lin.tiles)
    elif chosen != "triton_tiles":
        lin.weight = dequantize_rows(shards, device)
    if lin.tiles is not None and lin.tiles_from <= max_tokens:
        from . import tile_path

        tile_path.warm(lin)
    lin.handle = _registry.register(lin)
    return lin


def linear(x: torch.Tensor, lin: PreparedLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """bf16 [..., K] -> bf16 [..., N]; the same as torch.ops.b12x.linear."""
    check_tensor("x", x, dtype=torch.bfloat16, device=lin.device)
    if x.dim() == 0 or x.shape[-1] != lin.k:
        raise UnsupportedError(f"x {list(x.shape)}: last dim must be K={lin.k} of the {lin.format} weight")
    check_tokens("x", x.numel() // lin.k, lin.max_tokens)
    if bias is not None:
        check_tensor("bias", bias, dtype=(torch.bfloat16, torch.float32), device=lin.device, ndim=1)
        if bias.shape[0] != lin.n:
            raise ValueError(f"bias {list(bias.shape)} must have N={lin.n} entries")
    return torch.ops.b12x.linear(x, lin.handle, bias)


def linear_reference(x: torch.Tensor, lin: PreparedLinear, bias: torch.Tensor | None) -> torch.Tensor:
    x2 = x.reshape(-1, lin.k)
    y = quantize_activation(x2, lin.act_mode, lin.input_scale) @ lin.weight.T
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(torch.bfloat16).reshape(*x.shape[:-1], lin.n)
