"""Which implementation runs a prepared op: an ordered table of candidates, each answering (ok, reason).

Only the exact reference exists today; CUDA kernels join the table as they land (decode, prefill, MoE).
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


CANDIDATES: tuple[Candidate, ...] = (Candidate("reference", _reference),)

logger = logging.getLogger("b12x_core")
_logged: set[Query] = set()


def reasons(q: Query) -> list[tuple[str, bool, str]]:
    return [(c.name, *c.check(q)) for c in CANDIDATES]


def choose(q: Query) -> str:
    if q.path not in ("auto", "reference"):
        raise ValueError(f"path must be 'auto' or 'reference', got {q.path!r}")
    rows = reasons(q)
    for name, ok, why in rows:
        if ok:
            if q not in _logged:  # once per distinct (op, format, activation, device, path)
                _logged.add(q)
                logger.info("b12x: %s %s × %s on %s -> %s (%s)", q.op, q.format, q.activation, q.device, name, why)
            return name
    detail = "; ".join(f"{name}: {why}" for name, _, why in rows)
    raise UnsupportedError(f"no b12x path runs {q.op} {q.format} × {q.activation} on {q.device}: {detail}")
