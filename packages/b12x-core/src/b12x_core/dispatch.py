"""Which implementation runs a prepared op: an ordered table of candidates, each answering (ok, reason).

CUDA kernels so far: bf16-activation GEMV for every format, Triton tiles for every format × activation (the
prefill path, and the only path of quantized activations), Triton grouped GEMMs for fused MoE, the Q8_0
embedding.
A bf16 linear prepares both the GEMV and the tiles; `linear` picks by M (crossover.py).
The reference runs wherever torch runs, but on CUDA only when asked for (`path="reference"`): b12x never
silently falls back to a slow path on the GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .errors import UnsupportedError


@dataclass(frozen=True)
class Query:
    op: str  # "linear" | "moe" | "embedding"
    format: str
    activation: str
    device: torch.device
    path: str  # "auto" | "reference"
    k: int = 0  # input features (linear), for kernels with alignment rules


@dataclass(frozen=True)
class Candidate:
    name: str
    check: Callable[[Query], tuple[bool, str]]


def _reference(q: Query) -> tuple[bool, str]:
    if q.device.type == "cpu":
        return True, "exact reference (dequantize, float32 matmul, one bf16 rounding)"
    if q.path == "reference":
        return True, "exact reference, requested with path='reference'"
    return False, f"the reference runs on {q.device.type} only when asked for with path='reference'"


def _cuda_device(q: Query) -> str:
    """Why no kernel on the device can take a query ('' when one may): not CUDA, or the reference was asked for."""
    if q.device.type != "cuda":
        return f"needs a CUDA device, the op is on {q.device}"
    if q.path == "reference":
        return "path='reference' was asked for"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return ""


def _cuda_kernel(q: Query) -> str:
    """Why a CUDA kernel (b12x_kernels._C) cannot take a query whatever its shape ('' when it can)."""
    from .cuda_paths import kernels_unavailable

    return _cuda_device(q) or kernels_unavailable()


def _cuda_gemv_ggml(q: Query) -> tuple[bool, str]:
    from .cuda_paths import GGML

    if q.op != "linear" or q.format not in GGML or q.activation != "bf16":
        return False, f"runs linear {'/'.join(GGML)} × bf16, not {q.op} {q.format} × {q.activation}"
    why = _cuda_kernel(q)
    return (False, why) if why else (True, "CUDA GEMV over raw GGML blocks (M <= 16 per launch)")


def _cuda_gemv_elem(q: Query) -> tuple[bool, str]:
    from .cuda_paths import ELEMENT

    if q.op != "linear" or q.format not in ELEMENT or q.activation != "bf16":
        return False, f"runs linear {'/'.join(ELEMENT)} × bf16, not {q.op} {q.format} × {q.activation}"
    if q.k % 8:
        return False, f"needs K % 8 == 0, K is {q.k}"
    why = _cuda_kernel(q)
    return (False, why) if why else (True, "CUDA GEMV over element formats (M <= 16 per launch)")


def _triton_tiles(q: Query) -> tuple[bool, str]:
    from .cuda_paths import ELEMENT, GGML
    from .tile_path import triton_unavailable

    if q.op != "linear" or q.format not in GGML + ELEMENT:
        return False, f"runs linear of every format, not {q.op} {q.format}"
    why = _cuda_device(q) or triton_unavailable()  # Triton needs no b12x_kernels._C
    return (False, why) if why else (True, "Triton tensor-core tiles (prefill; every activation mode)")


def _triton_moe(q: Query) -> tuple[bool, str]:
    from .tile_path import triton_unavailable

    if q.op != "moe":
        return False, f"runs fused MoE, not {q.op}"
    why = _cuda_device(q) or triton_unavailable()
    return (False, why) if why else (True, "Triton grouped expert GEMMs over expert-sorted slots, activation fused")


def _cuda_embedding_q8_0(q: Query) -> tuple[bool, str]:
    if q.op != "embedding":
        return False, f"runs embedding Q8_0, not {q.op}"
    why = _cuda_kernel(q)
    return (False, why) if why else (True, "CUDA Q8_0 row gather")


# In order of preference: the first candidate that can run a query runs it.
CANDIDATES: tuple[Candidate, ...] = (
    Candidate("cuda_gemv_ggml", _cuda_gemv_ggml),
    Candidate("cuda_gemv_elem", _cuda_gemv_elem),
    Candidate("triton_tiles", _triton_tiles),
    Candidate("triton_moe", _triton_moe),
    Candidate("cuda_embedding_q8_0", _cuda_embedding_q8_0),
    Candidate("reference", _reference),
)

logger = logging.getLogger("b12x_core")
_logged: set[Query] = set()


def tiles_run(q: Query) -> bool:
    """Whether the Triton tiles can take this query (prepared beside a GEMV as its large-M path)."""
    return _triton_tiles(q)[0]


def reasons(q: Query) -> list[tuple[str, bool, str]]:
    return [(c.name, *c.check(q)) for c in CANDIDATES]


def choose(q: Query) -> str:
    if q.path not in ("auto", "reference"):
        raise ValueError(f"path must be 'auto' or 'reference', got {q.path!r}")
    if q.device.type == "cuda" and q.path == "auto":
        from .cuda_paths import warn_if_not_built

        warn_if_not_built()
    rows = reasons(q)
    for name, ok, why in rows:
        if ok:
            if q not in _logged:  # once per distinct (op, format, activation, device, path)
                _logged.add(q)
                logger.info("b12x: %s %s × %s on %s -> %s (%s)", q.op, q.format, q.activation, q.device, name, why)
            return name
    detail = "; ".join(f"{name}: {why}" for name, _, why in rows)
    raise UnsupportedError(f"no b12x path runs {q.op} {q.format} × {q.activation} on {q.device}: {detail}")
