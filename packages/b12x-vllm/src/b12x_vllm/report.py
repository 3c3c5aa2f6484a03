"""Which b12x path each prepared layer runs, for logs, the demo and tests (`b12x_vllm.report.summary()`)."""

from __future__ import annotations

import logging
from collections import Counter

logger = logging.getLogger("b12x_vllm")
_prepared: list[tuple[str, object]] = []  # (prefix, prepared b12x_core object), in this process


def record(prefix: str, prepared) -> None:
    _prepared.append((prefix, prepared))
    logger.debug("b12x: %s -> %r", prefix, prepared)


def describe(prepared) -> str:
    """e.g. 'linear IQ2_XS × bf16 -> reference'."""
    kind = type(prepared).__name__.removeprefix("Prepared").lower()
    if kind == "linear":
        what = f"{prepared.format} × {prepared.activation}"
    elif kind == "moe":
        what = f"{prepared.w13_format} × {prepared.act_format}"
    else:
        what = "Q8_0"
    return f"{kind} {what} -> {prepared.path}"


def summary() -> dict[str, int]:
    """How many layers run each (op, format × activation -> path) in this process."""
    return dict(sorted(Counter(describe(p) for _, p in _prepared).items()))
