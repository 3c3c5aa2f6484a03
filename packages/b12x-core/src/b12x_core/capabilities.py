"""What runs where: `capabilities(device)` lists (op, format, activation, path); `explain` shows the choice."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import b12x_formats as bf

from ._checks import resolve_device
from .dispatch import Query, reasons
from .moe import MOE_FORMATS


@dataclass(frozen=True)
class Capability:
    op: str
    format: str
    activation: str
    path: str  # the implementation `path="auto"` picks, or "unsupported"


class Capabilities(list):
    def __repr__(self) -> str:
        lines = [f"{'op':<10} {'format':<12} {'activation':<10} path"]
        lines += [f"{c.op:<10} {c.format:<12} {c.activation:<10} {c.path}" for c in self]
        return "\n".join(lines)


def _auto_path(op: str, fmt: str, activation: str, device: torch.device) -> str:
    for name, ok, _ in reasons(Query(op, fmt, activation, device, "auto")):
        if ok:
            return name
    return "unsupported"


def capabilities(device="cpu") -> Capabilities:
    device = resolve_device(device)
    rows = Capabilities()
    for fmt in bf.FORMATS:
        for act in bf.spec(fmt).activations:
            rows.append(Capability("linear", fmt, act, _auto_path("linear", fmt, act, device)))
    for fmt, acts in MOE_FORMATS.items():
        for act in acts:
            rows.append(Capability("moe", fmt, act, _auto_path("moe", fmt, act, device)))
    rows.append(Capability("embedding", "Q8_0", "bf16", _auto_path("embedding", "Q8_0", "bf16", device)))
    return rows


def explain(prepared, m: int | None = None) -> str:
    """Why `prepared` runs where it does, for a call with m tokens: every candidate with its reason."""
    lines = [f"{prepared!r}" + (f" at m={m}" if m is not None else "")]
    for name, ok, why in reasons(prepared.query):
        mark = "->" if name == prepared.path else ("ok" if ok else "no")
        lines.append(f"  {mark} {name}: {why}")
    if m is not None and m > getattr(prepared, "max_tokens", m):
        lines.append(f"  m={m} exceeds max_tokens={prepared.max_tokens}: the call would raise UnsupportedError")
    return "\n".join(lines)
