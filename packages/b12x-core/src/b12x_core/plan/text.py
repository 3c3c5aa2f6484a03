"""The plan as text (`bc.explain`): token ranges, configurations and sizes, printed the same everywhere."""

from __future__ import annotations

from ..backends.base import UNBOUNDED, Config


def tokens(lo: int, hi: int) -> str:
    return f"{lo}+" if hi == UNBOUNDED else f"{lo}-{hi}"


def format_config(config: Config) -> str:
    def value(v) -> str:
        if isinstance(v, dict):
            return "(" + " ".join(f"{k}={x}" for k, x in v.items()) + ")"
        return str(v)

    return ", ".join(f"{k}={value(v)}" for k, v in config.items()) or "-"


def size(nbytes: float) -> str:
    if nbytes < 1024:
        return f"{nbytes:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        nbytes /= 1024
        if nbytes < 1024 or unit == "GiB":
            break
    return f"{nbytes:.1f} {unit}"


def explain(plan, header: str, m: int | None = None) -> str:
    """The plan as a table a person reads (bc.explain): basis, held memory, the backends that cannot run, each
    decision with why it won and why the others lost, and each row's configuration; with m, only m's row."""
    lines = [header + (f" at m={m}" if m is not None else ""), f"plan: {plan.basis}"]
    held = plan.held_bytes()
    if held:
        lines.append(f"holds {size(held)} of weights on {plan.query.device.device}")
    if plan.never:
        lines.append("  cannot run here:")
        lines += [f"    {name}: {why}" for name, why in plan.never]
    last = plan.rows[-1].hi
    if m is not None and m > last:
        lines.append(f"  m={m} exceeds max_tokens={last}: the call would raise UnsupportedError")
        return "\n".join(lines)
    for d in plan.decisions:
        if m is not None and not d.lo <= m <= d.hi:
            continue
        lines.append(f"  {tokens(d.lo, d.hi)} tokens -> {d.backend.name}: {d.why}")
        for name, why in d.lost:
            lines.append(f"      {name} lost: {why}")
        for row in plan.rows:
            if row.decision is d and (m is None or row.lo <= m <= row.hi):
                lines.append(f"      {tokens(row.lo, row.hi):<12} {format_config(row.config)}")
    return "\n".join(lines)
