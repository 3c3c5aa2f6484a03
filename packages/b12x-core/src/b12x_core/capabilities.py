"""What runs where: `capabilities(device)` lists (op, format, activation, backends); `explain` prints a prepared
op's plan."""

from __future__ import annotations

from dataclasses import dataclass

import b12x_formats as bf

from ._checks import resolve_device
from .backends import DeviceInfo, MoEShape, Query, for_op
from .moe import MOE_FORMATS
from .recipe import activation_mode


@dataclass(frozen=True)
class Capability:
    op: str
    format: str
    activation: str
    path: str  # the backends `path="auto"` may plan with (", "-joined), or "unsupported"


class Capabilities(list):
    def __repr__(self) -> str:
        lines = [f"{'op':<10} {'format':<12} {'activation':<10} path"]
        lines += [f"{c.op:<10} {c.format:<12} {c.activation:<10} {c.path}" for c in self]
        return "\n".join(lines)


def _auto_path(op: str, fmt: str, activation: str, info: DeviceInfo) -> str:
    # an input_scale is assumed present (nvfp4 needs one; fp8 then reads as static)
    mode = activation_mode(fmt, activation, True)
    moe = MoEShape(1, 0, 0, 1, "silu", "gate_up", mode, fmt) if op == "moe" else None
    query = Query(op, fmt, activation, mode, info, moe=moe)
    names = [cls.name for cls in for_op(op) if cls.can_implement(query)[0]]
    return ", ".join(dict.fromkeys(names)) or "unsupported"


def capabilities(device="cpu") -> Capabilities:
    info = DeviceInfo.of(resolve_device(device))
    rows = Capabilities()
    for fmt in bf.FORMATS:
        for act in bf.spec(fmt).activations:
            rows.append(Capability("linear", fmt, act, _auto_path("linear", fmt, act, info)))
    for fmt, acts in MOE_FORMATS.items():
        for act in acts:
            rows.append(Capability("moe", fmt, act, _auto_path("moe", fmt, act, info)))
    rows.append(Capability("embedding", "Q8_0", "bf16", _auto_path("embedding", "Q8_0", "bf16", info)))
    return rows


def explain(prepared, m: int | None = None) -> str:
    """The plan of a prepared op: every token range, its backend and configuration, why it won and why every
    other backend lost; with `m`, the row a call of m tokens runs."""
    return prepared.plan.explain(repr(prepared), m)
