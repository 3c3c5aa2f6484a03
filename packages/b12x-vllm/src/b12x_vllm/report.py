"""Which b12x path each prepared layer runs, for logs, the demo and tests (`b12x_vllm.report.summary()`)."""

from __future__ import annotations

import logging
import re
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


def layer_types() -> list[dict]:
    """One row per layer type (layer numbers folded to '*'): how many layers, what runs them, and the reason
    its plan gave: e.g. {'layer': 'model.layers.*.mlp.down_proj', 'count': 30, 'runs': 'linear IQ2_XS × bf16 ->
    reference', 'why': 'exact reference (dequantize, float32 matmul, one bf16 rounding)'}."""
    rows: dict[tuple[str, str], dict] = {}
    for prefix, prepared in _prepared:
        layer = re.sub(r"\.\d+\.", ".*.", prefix)
        row = rows.setdefault((layer, describe(prepared)), {"layer": layer, "count": 0, "runs": describe(prepared)})
        row["count"] += 1
        row["why"] = why(prepared)
    return list(rows.values())


def why(prepared) -> str:
    """The reasons the layer's plan gave for the backends that run it (bc.explain prints the whole plan)."""
    decisions = prepared.plan.decisions
    if len(decisions) == 1:
        return decisions[0].why
    return "; ".join(f"{d.backend.name} ({d.lo}-{d.hi} tokens): {d.why}" for d in decisions)


def reason_line() -> str:
    """One line on why the layers run where they do."""
    if _prepared and all(p.path == "reference" and p.device.type == "cpu" for _, p in _prepared):
        return (
            "every op runs b12x_core's exact reference (exact dequantize, float32 matmul, one bf16 rounding): "
            "b12x's kernels are CUDA and Triton kernels and this run is on the CPU"
        )
    return "each layer runs what its plan picked per token range: the fastest measured b12x backend (bc.explain)"
