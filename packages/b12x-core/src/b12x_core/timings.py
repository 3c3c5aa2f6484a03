"""The measured times the plan picks from: per (GPU, format, activation mode, shape class), each backend's µs per
call at a set of token counts (committed in timings.json, written by `benchmarks/plan_check.py --emit-table` for
linears and `benchmarks/moe.py --emit-table` for MoE layers). A GPU or key without measurements gets the
conservative default plan (b12x_core.plan), which explain marks as such.

A GPU is its name (torch.cuda.get_device_name), with its compute capability as the fallback: GPUs of one
capability differ in memory bandwidth (an H200 reads 1.4× an H100's), and so in where one backend overtakes
another. A GPU with measurements of its own for a key reads those; one without reads its capability's (an entry
with no name recorded first, else another GPU's), and explain says which GPU the times came from.

A shape class is one measured layer shape, "NxK" (a MoE's: "2IxH" of its gate/up GEMM). Any other layer takes
the class nearest to it in log size, |log2 N/N'| + |log2 K/K'| (speed ratios between backends follow a layer's
size and proportions; the crossovers of a 4096-wide 8B layer are not those of 8192×8192), and explain names the
class used.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from b12x_formats.kernel_facts import SAME_LAYOUT

TABLE = Path(__file__).with_name("timings.json")


def shape_class(n: int, k: int) -> str:
    """The class a layer of N × K measures: "NxK"."""
    return f"{n}x{k}"


def class_size(shape: str) -> tuple[int, int]:
    n, k = shape.split("x")
    return int(n), int(k)


def class_distance(shape: str, n: int, k: int) -> float:
    """How far a measured class is from an N × K layer: |log2 N/N'| + |log2 K/K'|."""
    cn, ck = class_size(shape)
    return abs(math.log2(cn / n)) + abs(math.log2(ck / k))


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
    device: str = ""  # the GPU's name it was measured on; "": any GPU of its capability

    def time(self, backend: str, m: int, layout: str | None = None) -> tuple[float | None, str]:
        """(µs, how it was read) of `backend` at a measured token count m: "measured"; between two measurements
        of the backend "interpolated" (linearly); below its first "bound" (that first time: work grows with M);
        above its last or never "unmeasured" (None). A backend that reads several layouts of the weight may be
        measured on each: "name@layout" holds its times on that layout (bare "name": its first layout)."""
        times = self.us.get(f"{backend}@{layout}") or self.us.get(backend)
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


def device_key(name: str) -> str:
    """A GPU name as entries are matched on: case and runs of whitespace aside, the name itself (an "NVIDIA H100
    80GB HBM3" is not an "NVIDIA H100 PCIe": their bandwidths differ as an H100's and an H200's do)."""
    return " ".join(name.split()).casefold()


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
            e.get("device", ""),
        )  # fmt: skip
        for e in data["entries"]
    )


# Modes whose backends and kernels are those of bf16 activations plus one quantization pass: where a GPU has no
# measurements of their own, its bf16 measurements of the format stand in.
BF16_STAND_IN = ("mxfp8", "nvfp4")


def lookup(capability, fmt: str, act_mode: str, n: int, k: int, entries=None, op: str = "linear", device: str = ""):
    """-> (the entry for this key, '' or what stands in for what) or None when the op × GPU × format × mode is
    unmeasured. The GPU named `device` ("": unknown) reads its own measurements first, those of the stand-in mode
    included (the device preference comes first), then those of any GPU of `capability` (measured_on says
    whose). Stand-ins: the nearest measured shape class of the same GPU,
    format and mode; for mxfp8 / nvfp4 activations, the format's bf16 measurements."""
    if capability is None:
        return None
    entries = load() if entries is None else entries
    fmt = _key_format(fmt)
    notes = []
    modes = (act_mode, "bf16") if act_mode in BF16_STAND_IN else (act_mode,)
    keys = [(op, tuple(capability), fmt, mode) for mode in modes]
    keyed = [(key[-1], [e for e in entries if (e.op, e.capability, e.format, e.act_mode) == key]) for key in keys]
    own = [(mode, [e for e in es if device and device_key(e.device) == device_key(device)]) for mode, es in keyed]
    # no measurements of its own: an entry of no named GPU stands for every GPU of its capability, else any does
    # (ordered by name, so which one does not follow the file's order)
    shared = [(mode, [e for e in es if not e.device] or sorted(es, key=lambda e: device_key(e.device)))
              for mode, es in keyed]  # fmt: skip
    mode, same = next(((mode, es) for mode, es in own + shared if es), (None, []))
    if not same:
        return None
    if mode != act_mode:
        notes.append(f"bf16 measurements stand in for {act_mode} (same kernels plus a quantization pass)")
    if n <= 0 or k <= 0:  # a query of any shape (capabilities): the largest class
        best = max(same, key=lambda e: math.prod(class_size(e.shape)))
    else:
        best = min(same, key=lambda e: (class_distance(e.shape, n, k), e.shape))
    if best.shape != shape_class(n, k):
        notes.append(f"the nearest measured shape class stands in for this layer's {n}x{k}")
    return best, "; ".join(notes)


def measured_on(entry: Entry, device: str = "") -> str:
    """Where `entry`'s times come from, for a query on the GPU named `device` ("": unknown): the GPU's name where it
    is this GPU, else the capability, with the other GPU's name where the entry records one."""
    arch = f"sm_{entry.capability[0]}{entry.capability[1]}"
    if not entry.device:
        return arch
    if device_key(entry.device) == device_key(device):
        return entry.device
    return f"another {arch} GPU ({entry.device})" if device else arch


def dumps(entries: list[Entry]) -> str:
    """The table file's text (benchmarks/plan_check.py --emit-table)."""
    rows = [dict(capability=list(e.capability), format=e.format, act_mode=e.act_mode, shape=e.shape, ms=list(e.ms),
                 us={k: list(v) for k, v in e.us.items()}, source=e.source, op=e.op, device=e.device)
            for e in entries]  # fmt: skip
    return json.dumps({"version": 1, "entries": rows}, indent=1) + "\n"


def merge(path: Path, new: list[Entry]) -> None:
    """Write the table at `path` (atomically) with `new` merged into the entries of the same key (the benchmarks'
    --emit-table: a run of some shapes, formats or token counts keeps the rest of the table). Within an entry, the
    new run's times replace the old at the token counts it measured; the old entry's other token counts stay (a
    re-measure of 16-512 tokens keeps one token's times). The key holds the GPU: an H100's run leaves an H200's
    entries of the same shape as they are."""

    def key(e: Entry):
        return (e.op, e.capability, device_key(e.device), e.format, e.act_mode, e.shape)

    table = {key(e): e for e in load.__wrapped__(path)}
    for e in new:
        table[key(e)] = merge_entry(table[key(e)], e) if key(e) in table else e
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dumps(list(table.values())))
    tmp.replace(path)


def merge_entry(old: Entry, new: Entry) -> Entry:
    """`new`'s times where it measured (a token count it ran and a time, not None), `old`'s elsewhere."""
    ms = tuple(sorted(set(old.ms) | set(new.ms)))

    def at(entry: Entry, name: str, m: int):
        times = entry.us.get(name)
        return times[entry.ms.index(m)] if times is not None and m in entry.ms else None

    us = {}
    for name in dict.fromkeys([*new.us, *old.us]):
        times = tuple(t if (t := at(new, name, m)) is not None else at(old, name, m) for m in ms)
        if any(t is not None for t in times):
            us[name] = times
    kept = {m: src for m, src in token_sources(old).items() if m not in new.ms}
    source = grouped_source({**{m: new.source for m in new.ms}, **kept})
    return Entry(new.capability, new.format, new.act_mode, new.shape, ms, us, source, new.op, new.device)


def token_sources(entry: Entry) -> dict[int, str]:
    """Which run measured each token count of an entry, read from its source text: one run for all, the grouped
    form grouped_source writes ("tokens 1, 2: run B; tokens 16: run A"), or the nested form earlier merges wrote
    ("run C; tokens 16, 64: run B; tokens 64: run A", each list narrowing the one before it)."""
    segments = entry.source.split("; tokens ")
    grouped = entry.source.startswith("tokens ")
    if grouped:
        segments[0] = segments[0].removeprefix("tokens ")
    lists = []
    for segment in segments[0 if grouped else 1 :]:
        tokens, sep, src = segment.partition(": ")
        if not sep or not all(t.isdigit() for t in tokens.split(", ")):
            return dict.fromkeys(entry.ms, entry.source)  # not a form written here: one source, as it reads
        lists.append(({int(t) for t in tokens.split(", ")}, src))
    if grouped:
        return {m: next((src for tokens, src in lists if m in tokens), entry.source) for m in entry.ms}
    out = {}
    for m in entry.ms:
        out[m] = segments[0]
        for tokens, src in lists:
            if m not in tokens:
                break
            out[m] = src
    return out


def grouped_source(sources: dict[int, str]) -> str:
    """An entry's source text from the run that measured each token count: that run's when one run measured all,
    else each run once with its token counts ("tokens 1, 2, 4: run B; tokens 512: run A")."""
    runs: dict[str, list[int]] = {}
    for m in sorted(sources):
        runs.setdefault(sources[m], []).append(m)
    if len(runs) == 1:
        return next(iter(runs))
    return "; ".join(f"tokens {', '.join(map(str, ms))}: {src}" for src, ms in runs.items())
