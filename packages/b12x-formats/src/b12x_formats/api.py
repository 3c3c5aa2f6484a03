"""The package's front door: `spec`, `quantize`, `dequantize` (see DESIGN.md's public API)."""

from __future__ import annotations

import numpy as np

from ._arrays import require_finite, to_float32
from .quantized import QuantizedWeight, codec_for
from .spec import Codec, FormatSpec


def formats() -> tuple[str, ...]:
    codec_for("FP8")  # make sure every codec is registered
    return tuple(Codec.registry)


def spec(name: str) -> FormatSpec:
    """The facts of a format, looked up case-insensitively (aliases such as FP8_PB_WO included)."""
    return codec_for(name).spec


def tensor_shapes(fmt: str, lead: tuple[int, ...], n: int, k: int) -> dict[str, tuple | str]:
    """Every tensor the format may store for a logical [*lead, n, k] weight: name -> exact shape, or PER_TENSOR
    for a per-tensor scale (a scalar, or one per leading index)."""
    return codec_for(fmt).expected_shapes(tuple(lead), n, k)


def per_tensor_names(fmt: str) -> tuple[str, ...]:
    """The format's per-tensor scales (FP8 weight_scale, NVFP4 weight_scale_2, input_scale)."""
    return codec_for(fmt).per_tensor_names()


def quantize(w, fmt: str, importance=None) -> QuantizedWeight:
    """Quantize float weights [..., N, K] (numpy or torch, any float dtype) into `fmt`.

    `importance` (IQ2 only; others ignore it) holds non-negative per-column weights [K] or [..., K], e.g. an
    importance matrix's mean squared activations: the IQ2 search minimises
    Σ importance·sqrt(σ² + w²)·(w − ŵ)², σ² the mean square of w's block of 256 (llama.cpp's weighting; without
    `importance`, the same with importance 1).
    """
    codec = codec_for(fmt)
    name = codec.spec.name
    arr = to_float32(w, "w")
    if arr.ndim < 2:
        raise ValueError(f"{name}: weight must be [..., N, K], got shape {list(arr.shape)}")
    k = arr.shape[-1]
    if k % codec.spec.k_multiple:
        group = codec.spec.k_multiple
        raise ValueError(f"{name}: K={k} (weight shape {list(arr.shape)}) is not a multiple of the group size {group}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: weight {list(arr.shape)} holds NaN or Inf; only finite weights can be quantized")
    imp = None
    if importance is not None:
        imp = to_float32(importance, "importance")
        try:
            imp = np.broadcast_to(imp, arr.shape[:-2] + (k,))
        except ValueError:
            raise ValueError(
                f"{name}: importance {list(imp.shape)} must be [K] or [..., K] for weight {list(arr.shape)}"
            ) from None
        if not np.isfinite(imp).all() or (imp < 0).any():
            raise ValueError(f"{name}: importance must be finite and >= 0")
    tensors = codec.quantize(arr, imp)
    return QuantizedWeight.from_tensors(name, tensors)


def dequantize(qw: QuantizedWeight) -> np.ndarray:
    """Exact float32 [..., N, K] decode of a QuantizedWeight (validated again: it may have been mutated)."""
    checked = QuantizedWeight.from_tensors(qw.format, qw.tensors)
    codec = codec_for(checked.format)
    *lead, n, k = checked.shape
    # valid but extreme scales (E8M0 254, float32 scales near its max) can push scale × element past float32:
    # refused below with the index, instead of numpy's warning
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(codec.dequantize(checked.tensors, tuple(lead), n, k), dtype=np.float32)
    require_finite(f"{checked.format}: decoded weight", out, "scale × element overflows float32; no kernel can run it")
    return out
