"""The measured times the plan picks from: per (compute capability, format, activation mode, shape class), each
backend's µs per call at a set of token counts (committed in crossover.json, written by
`benchmarks/plan_check.py --emit-table`). A GPU or key without measurements gets the conservative default plan
(plan.py), which explain marks as such.

Shape classes bucket N and K (a layer's speed ratios between backends follow its size class more than its exact
size); a key measured on another class of the same GPU, format and mode stands in for an unmeasured class, and
explain says so.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from b12x_formats.kernel_facts import SAME_LAYOUT

TABLE = Path(__file__).with_name("crossover.json")
SIZE_CLASSES = ((4096, "S"), (16384, "M"))  # below 4096: S, below 16384: M, else L


def size_class(v: int) -> str:
    return next((name for bound, name in SIZE_CLASSES if v < bound), "L")


def shape_class(n: int, k: int) -> str:
    """e.g. "N:M/K:L" for 8192 × 28672 (S < 4096 <= M < 16384 <= L)."""
    return f"N:{size_class(n)}/K:{size_class(k)}"


@dataclass(frozen=True)
class Entry:
    capability: tuple[int, int]
    format: str
    act_mode: str
    shape: str
    ms: tuple[int, ...]  # token counts measured, ascending
    us: dict  # backend name -> tuple of µs per call at ms (None: not measured there)
    source: str = ""
    op: str = "linear"  # linear | moe: a MoE's token counts and times say nothing of a linear's, nor back

    def time(self, backend: str, m: int) -> tuple[float | None, str]:
        """(µs, how it was read) of `backend` at a measured token count m: "measured"; between two measurements
        of the backend "interpolated" (linearly); below its first "bound" (that first time: work grows with M);
        above its last or never "unmeasured" (None)."""
        times = self.us.get(backend)
        known = [(p, t) for p, t in zip(self.ms, times or (), strict=False) if t is not None]
        if not known:
            return None, "unmeasured"
        exact = dict(known)
        if m in exact:
            return exact[m], "measured"
        for (p0, t0), (p1, t1) in zip(known, known[1:], strict=False):
            if p0 < m < p1:
                return t0 + (t1 - t0) * (m - p0) / (p1 - p0), "interpolated"
        if m < known[0][0]:
            return known[0][1], "bound"
        return None, "unmeasured"


def _key_format(fmt: str) -> str:
    """Formats that share a kernel layout share measurements (W4A16_NVFP4 runs as NVFP4)."""
    return SAME_LAYOUT.get(fmt, fmt)


@functools.cache
def load(path: Path = TABLE) -> tuple[Entry, ...]:
    if not path.exists():
        return ()
    data = json.loads(path.read_text())
    return tuple(
        Entry(
            tuple(e["capability"]),
            e["format"],
            e["act_mode"],
            e["shape"],
            tuple(e["ms"]),
            {name: tuple(times) for name, times in e["us"].items()},
            e.get("source", ""),
            e.get("op", "linear"),
        )  # fmt: skip
        for e in data["entries"]
    )


# Modes whose backends and kernels are those of bf16 activations plus one quantization pass: where a GPU has no
# measurements of their own, its bf16 measurements of the format stand in.
BF16_STAND_IN = ("mxfp8", "nvfp4")
_ORDER = "SML"


def _class_distance(a: str, b: str) -> int:
    sizes = [[_ORDER.index(part.split(":")[1]) for part in s.split("/")] for s in (a, b)]
    return sum(abs(x - y) for x, y in zip(*sizes, strict=True))


def lookup(capability, fmt: str, act_mode: str, n: int, k: int, entries=None, op: str = "linear"):
    """-> (the entry for this key, '' or what stands in for what) or None when the op × GPU × format × mode is
    unmeasured. Stand-ins: another shape class of the same GPU, format and mode (the nearest by size); for
    mxfp8 / nvfp4 activations, the format's bf16 measurements."""
    if capability is None:
        return None
    entries = load() if entries is None else entries
    fmt = _key_format(fmt)
    notes = []
    modes = (act_mode, "bf16") if act_mode in BF16_STAND_IN else (act_mode,)
    for mode in modes:
        same = [e for e in entries if (e.op, e.capability, e.format, e.act_mode) == (op, tuple(capability), fmt, mode)]
        if same:
            break
    else:
        return None
    if mode != act_mode:
        notes.append(f"bf16 measurements stand in for {act_mode} (same kernels plus a quantization pass)")
    want = shape_class(n, k)
    best = min(same, key=lambda e: _class_distance(e.shape, want))
    if best.shape != want:
        notes.append(f"shape class {best.shape} stands in for this layer's {want}")
    return best, "; ".join(notes)


def dumps(entries: list[Entry]) -> str:
    """The table file's text (benchmarks/plan_check.py --emit-table)."""
    rows = [dict(capability=list(e.capability), format=e.format, act_mode=e.act_mode, shape=e.shape, ms=list(e.ms),
                 us={k: list(v) for k, v in e.us.items()}, source=e.source, op=e.op) for e in entries]  # fmt: skip
    return json.dumps({"version": 1, "entries": rows}, indent=1) + "\n"
