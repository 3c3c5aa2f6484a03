"""One plan per prepared op: the only place that chooses what runs.

A `Plan` is an ordered table of token ranges, each with the backend that runs it, that backend's configuration
(tile sizes, accumulator bucket, K splits, ...), why it won and why every other backend lost. `prepare_*` builds it
once (`build`): every backend of the op answers `can_implement(query)`; among those that can, each token range
goes to the fastest backend measured on this GPU for this format, activation mode and shape class
(crossover.py), or, where nothing is measured, to the conservative default (each backend's `default_tokens`,
registry order breaking ties); the chosen backends are prepared, split their ranges by configuration, size the
shared workspaces, and every row is run once (warmed) so no call compiles or initialises anything.
`linear` / `moe` / `embedding` then run `plan.for_tokens(m).run(...)`.

One copy of the weight: backends read different device layouts of it (`Backend.reads`). Where the fastest
backend per range would need two (the tensor-core GEMM's repacked tiles for small M, the checkpoint layout for
the GEMV or the Triton tiles), the plan keeps the family of backends that share one layout and loses least
against the fastest at the measured token counts (unmeasured: the family of the M=1 default), and explain says
what that costs. `B12X_WEIGHT_COPIES=2`, read when the plan is made, lets every range take its fastest backend.
"""

from __future__ import annotations

import bisect
import logging
import os
import sys
from dataclasses import dataclass, field

import torch

from . import backends, crossover, workspace
from .backends import Backend, Config, Query
from .errors import UnsupportedError

UNBOUNDED = sys.maxsize  # the last token of an op without max_tokens (embedding)
logger = logging.getLogger("b12x_core")
_logged: set = set()


@dataclass(frozen=True)
class Decision:
    """A token range and the backend class that runs it, with the reasons."""

    lo: int
    hi: int
    backend: type[Backend]
    why: str
    lost: tuple[tuple[str, str], ...] = ()  # (backend, why it lost on this range), for backends that could run


@dataclass(frozen=True)
class Row:
    """A token range, its prepared backend and that backend's configuration."""

    lo: int
    hi: int
    backend: Backend
    config: Config
    decision: Decision = field(repr=False)

    def run(self, *args):
        return self.backend.run(*args, config=self.config)


def _tokens(lo: int, hi: int) -> str:
    return f"{lo}+" if hi == UNBOUNDED else f"{lo}-{hi}"


def format_config(config: Config) -> str:
    def value(v) -> str:
        if isinstance(v, dict):
            return "(" + " ".join(f"{k}={x}" for k, x in v.items()) + ")"
        return str(v)

    return ", ".join(f"{k}={value(v)}" for k, v in config.items()) or "-"


@dataclass
class Plan:
    query: Query
    basis: str  # how the ranges were decided: measurements, defaults, or a single capable backend
    never: tuple[tuple[str, str], ...]  # (backend of this op, why it cannot run this query here)
    decisions: tuple[Decision, ...]
    rows: tuple[Row, ...]

    def __post_init__(self):
        self._starts = [row.lo for row in self.rows]

    def for_tokens(self, m: int) -> Row:
        """The row of a call with m tokens (1 <= m <= the op's max_tokens)."""
        i = bisect.bisect_right(self._starts, m) - 1
        if i < 0 or m > self.rows[i].hi:
            raise UnsupportedError(f"a call of {m} tokens is outside the plan (tokens 1-{self.rows[-1].hi})")
        return self.rows[i]

    @property
    def backend_names(self) -> list[str]:
        return list(dict.fromkeys(d.backend.name for d in self.decisions))

    def summary(self) -> str:
        """e.g. "cuda_gemv (1-4), triton_tiles (5-32), decode_gemm (33-8192)"; one name when one backend."""
        if len(self.decisions) == 1:
            return self.decisions[0].backend.name
        return ", ".join(f"{d.backend.name} ({_tokens(d.lo, d.hi)})" for d in self.decisions)

    def held_bytes(self) -> int:
        """Bytes of memory the plan's prepared backends hold (their weights in every layout kept, each storage
        once: layouts shared between backends or with a tied embedding count once; the per-device scratch that
        every op shares does not count). 0 for a preview."""
        storages = {}
        for backend in {id(row.backend): row.backend for row in self.rows}.values():
            for t in _tensors(vars(backend), set()):
                storage = t.untyped_storage()
                storages[(t.device, storage.data_ptr())] = storage.nbytes()
        return sum(storages.values())

    def explain(self, header: str, m: int | None = None) -> str:
        lines = [header + (f" at m={m}" if m is not None else ""), f"plan: {self.basis}"]
        held = self.held_bytes()
        if held:
            lines.append(f"holds {_size(held)} of weights on {self.query.device.device}")
        if self.never:
            lines.append("  cannot run here:")
            lines += [f"    {name}: {why}" for name, why in self.never]
        last = self.rows[-1].hi
        if m is not None and m > last:
            lines.append(f"  m={m} exceeds max_tokens={last}: the call would raise UnsupportedError")
            return "\n".join(lines)
        for d in self.decisions:
            if m is not None and not d.lo <= m <= d.hi:
                continue
            lines.append(f"  {_tokens(d.lo, d.hi)} tokens -> {d.backend.name}: {d.why}")
            for name, why in d.lost:
                lines.append(f"      {name} lost: {why}")
            for row in self.rows:
                if row.decision is d and (m is None or row.lo <= m <= row.hi):
                    lines.append(f"      {_tokens(row.lo, row.hi):<12} {format_config(row.config)}")
        return "\n".join(lines)


def _tensors(obj, seen: set):
    """Every torch tensor reachable from obj through containers and the attributes of b12x objects."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, seen)
    elif type(obj).__module__.startswith("b12x_core") and hasattr(obj, "__dict__"):
        yield from _tensors(vars(obj), seen)


def _size(nbytes: float) -> str:
    if nbytes < 1024:
        return f"{nbytes:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        nbytes /= 1024
        if nbytes < 1024 or unit == "GiB":
            break
    return f"{nbytes:.1f} {unit}"


def weight_copies() -> int:
    """B12X_WEIGHT_COPIES=2 lets a plan hold the weight in two layouts (each range its fastest backend); 1 (the
    default) keeps one copy. Read when the plan is made."""
    return 2 if os.environ.get("B12X_WEIGHT_COPIES", "1").strip() == "2" else 1


def common_layouts(backends_) -> set[str]:
    """The weight layouts every backend of the list reads."""
    return set.intersection(*(set(cls.reads) for cls in backends_))


def shared_layout(backends_: list[type[Backend]]) -> str | None:
    """The layout every backend of the list reads (the checkpoint's where that is one of them), or None."""
    common = common_layouts(backends_)
    if not common:
        return None
    return "checkpoint" if "checkpoint" in common else sorted(common)[0]


def one_copy(able, decisions, decide, entry=None) -> tuple[list | None, str | None, str]:
    """-> (the capable backends the plan keeps, the layout they share, what it costs) when the plan must choose
    one layout of the weight; (None, None, "") when the decisions stand as they are (B12X_WEIGHT_COPIES=2, or
    their backends share a layout and lose nothing on it). `decide(subset, layout)` remakes the decisions among
    a subset, with each backend's times on that layout (crossover.Entry.time). Each layout's family is the
    backends reading it; measured (`entry`), the family whose decisions lose least against the fastest at the
    measured token counts wins (ties: the layout the fastest already share), unmeasured the M=1 winner's."""
    chosen = list(dict.fromkeys(d.backend for d in decisions))
    shared = shared_layout(chosen)
    if weight_copies() == 2 or (shared is not None and entry is None):
        return None, None, ""
    layouts = list(dict.fromkeys(layout for cls in able for layout in cls.reads))
    families = {layout: [cls for cls in able if layout in cls.reads] for layout in layouts}
    if entry is None:
        first = decisions[0].backend
        layout = next(layout for layout in layouts if layout in first.reads)
        return families[layout], layout, (f"one weight copy ({layout} layout: the M=1 default's; "
                                          "B12X_WEIGHT_COPIES=2 for two)")  # fmt: skip

    def worst(family, layout) -> float:
        """The largest ratio, over measured M, of the family's winner time (on its layout) to the fastest's."""
        fam = decide(family, layout)
        ratio = 1.0
        for p in entry.ms:
            if p > decisions[-1].hi:
                break
            best = next(d for d in decisions if d.lo <= p <= d.hi).backend.name
            mine = next(d for d in fam if d.lo <= p <= d.hi).backend.name
            t_best, t_mine = entry.time(best, p)[0], entry.time(mine, p, layout)[0]
            if t_best and t_mine:
                ratio = max(ratio, t_mine / t_best)
        return ratio

    costs = {layout: worst(fam, layout) for layout, fam in families.items() if fam}
    layout = min(costs, key=lambda lay: (costs[lay], lay != shared))
    if layout == shared and costs[layout] == 1.0:
        return None, shared, ""  # the fastest per range share this layout and lose nothing on it
    cost = (f"one weight copy ({layout} layout): at most {costs[layout]:.2f}× the fastest backend at the measured M "
            "(B12X_WEIGHT_COPIES=2 holds two copies for that)")  # fmt: skip
    return families[layout], layout, cost


def _excluded(decisions: list[Decision], able, family) -> list[Decision]:
    """The decisions, each listing the capable backends left out for needing another copy of the weight."""
    out = tuple((cls.name, f"would hold a second copy of the weight ({' or '.join(cls.reads)} layout)")
                for cls in able if cls not in family)  # fmt: skip
    return [Decision(d.lo, d.hi, d.backend, d.why, d.lost + out) for d in decisions]


def _verdicts(query: Query):
    return [(cls, *cls.can_implement(query)) for cls in backends.for_op(query.op)]


def _default_decisions(able: list[type[Backend]], lo: int, hi: int, basis_note: str) -> list[Decision]:
    """The conservative default: per token, the first capable backend (registry order) whose default_tokens
    cover it; where none does, the first capable one."""

    def covers(cls, m):
        first, last = cls.default_tokens
        return first <= m and (last is None or m <= last)

    bounds = {lo, hi + 1}
    for cls in able:
        first, last = cls.default_tokens
        bounds |= {b for b in (first, None if last is None else last + 1) if b is not None and lo < b <= hi}
    edges = sorted(bounds)
    out: list[Decision] = []
    for a, b in zip(edges, edges[1:], strict=False):
        winner = next((cls for cls in able if covers(cls, a)), able[0])
        why = f"default for {_tokens(a, b - 1)} tokens ({basis_note})"
        lost = []
        for cls in able:
            if cls is winner:
                continue
            if covers(cls, a):
                lost.append((cls.name, f"unmeasured here: the default order puts {winner.name} first"))
                continue
            first, last = cls.default_tokens
            span = f"{first}+" if last is None else f"{first}-{last}"
            lost.append((cls.name, f"the defaults prefer {winner.name} here (its default range: {span} tokens)"))
        out.append(Decision(a, b - 1, winner, why, tuple(lost)))
    return out


def _measured_decisions(able, entry: crossover.Entry, hi: int, layout: str | None = None) -> list[Decision]:
    """Per measured token count p: the fastest capable backend there (its time on `layout` where measured per
    layout); it runs the tokens after the previous measured count up to p (the last measured count's winner also
    runs everything above it)."""
    points = list(entry.ms)
    spans = []
    prev = 0
    for i, p in enumerate(points):
        top = hi if i == len(points) - 1 else min(p, hi)
        if prev + 1 > top:
            break
        texts, known = {}, []
        for cls in able:
            t, how = entry.time(cls.name, p, layout)
            texts[cls.name] = "?" if t is None else {"interpolated": "~", "bound": "≤"}.get(how, "") + f"{t:.1f}"
            if t is not None:
                known.append((t, cls))
        winner = min(known, key=lambda tc: tc[0])[1] if known else None
        spans.append((prev + 1, top, winner, p, texts))
        prev = top
    out: list[Decision] = []
    for lo, top, winner, p, texts in spans:
        if winner is None:  # nothing capable measured here: the defaults decide this span
            out += _default_decisions(able, lo, top, f"nothing capable measured at M={p}")
            continue
        out.append(Decision(lo, top, winner, f"fastest at M={p}: {texts[winner.name]}",
                            tuple((c.name, f"M={p}: {texts[c.name]}") for c in able if c is not winner)))  # fmt: skip
    return _merge(out)


def _merge(decisions: list[Decision]) -> list[Decision]:
    """Join neighbouring ranges of one backend, their evidence listed together."""
    out: list[Decision] = []
    for d in decisions:
        prev = out[-1] if out else None
        if prev is not None and prev.backend is d.backend and prev.hi + 1 == d.lo:
            lost = dict(prev.lost)
            for name, why in d.lost:
                lost[name] = f"{lost[name]}, {why}" if name in lost else why
            why = f"{prev.why}, {d.why.removeprefix('fastest at ')}"
            out[-1] = Decision(prev.lo, d.hi, d.backend, why, tuple(lost.items()))
        else:
            out.append(d)
    return out


def warn_if_not_built(query: Query) -> None:
    """On a CUDA device, say once, in one line, that this install has no CUDA kernels and how to get them: the
    Triton paths still run, the CUDA-only ones refuse (never a silent slow path)."""
    if not query.on_cuda or "not_built" in _logged:
        return
    try:
        import b12x_kernels
    except ImportError:
        return  # every CUDA backend's refusal names it
    why = b12x_kernels.not_built_reason()
    if why:
        _logged.add("not_built")
        logger.warning("b12x: %s", why)


def choose(query: Query, entries=None) -> tuple[str, tuple, list[Decision]]:
    """-> (basis, backends that cannot run the query with why, decisions over 1..max_tokens). No device work:
    a plan can be worked out for a DeviceInfo of a GPU that is not here."""
    if query.path not in ("auto", "reference"):
        raise ValueError(f"path must be 'auto' or 'reference', got {query.path!r}")
    warn_if_not_built(query)
    verdicts = _verdicts(query)
    able = [cls for cls, ok, _ in verdicts if ok]
    never = tuple((cls.name, why) for cls, ok, why in verdicts if not ok)
    what = f"{query.op} {query.format} × {query.activation}"
    if not able:
        detail = "; ".join(f"{cls.name}: {why}" for cls, _, why in verdicts)
        raise UnsupportedError(f"no b12x path runs {what} on {query.device.device}: {detail}")
    hi = query.max_tokens
    if len(able) == 1:
        why = next(why for cls, ok, why in verdicts if ok)
        return "one backend runs this here", never, [Decision(1, hi, able[0], why)]
    arch = query.device.arch
    found = crossover.lookup(query.device.capability, query.format, query.act_mode, query.n, query.k, entries,
                             op=query.op)  # fmt: skip
    if found is None:
        note = f"no measurements for {arch} {query.format} × {query.act_mode}"
        basis = f"conservative defaults ({note})"
        decisions = _default_decisions(able, 1, hi, "unmeasured")
        family, _, cost = one_copy(able, decisions, lambda subset, _: _default_decisions(subset, 1, hi, "unmeasured"))
        if family is None:
            return basis, never, decisions
        return f"{basis}; {cost}", never, _excluded(_merge(_default_decisions(family, 1, hi, "unmeasured")), able,
                                                    family)  # fmt: skip
    entry, note = found
    basis = (f"measured on {arch}, shape class {entry.shape} ({entry.source}){'; ' + note if note else ''}; "
             f"per range the fastest at its last measured M (µs; ~ interpolated, ≤ bounded by a larger M's time, "
             f"? unmeasured)")  # fmt: skip
    decisions = _measured_decisions(able, entry, hi)
    family, layout, cost = one_copy(able, decisions, lambda subset, lay: _measured_decisions(subset, entry, hi, lay),
                                    entry)  # fmt: skip
    if family is None:
        return basis, never, decisions if layout is None else _measured_decisions(able, entry, hi, layout)
    return f"{basis}; {cost}", never, _excluded(_measured_decisions(family, entry, hi, layout), able, family)


def preview(query: Query, entries=None) -> Plan:
    """The plan prepare_* would build for `query`, without preparing anything (its rows cannot run): what a GPU
    that is not here would run (docs, tests, planning a deployment)."""
    basis, never, decisions = choose(query, entries)
    rows = []
    for d in decisions:
        backend = d.backend.__new__(d.backend)  # configurations depend on the query only
        Backend.__init__(backend, query, None)
        rows += [Row(lo, hi, backend, config, d) for lo, hi, config in backend.configs(d.lo, d.hi)]
    return Plan(query, basis, never, tuple(decisions), tuple(rows))


def _warm_args(query: Query, tokens: int) -> tuple:
    device = query.device.device
    if query.op == "linear":
        return torch.zeros(tokens, query.k, dtype=torch.bfloat16, device=device), None
    if query.op == "moe":
        top_k = query.moe.top_k
        ids = torch.zeros(tokens, top_k, dtype=torch.int32, device=device)  # every slot to expert 0
        weights = torch.full((tokens, top_k), 1.0 / top_k, device=device)
        return torch.zeros(tokens, query.moe.hidden, dtype=torch.bfloat16, device=device), weights, ids
    return (torch.zeros(tokens, dtype=torch.int32, device=device),)


def build(query: Query, weights, entries=None, only: type[Backend] | None = None, warm: bool = True) -> Plan:
    """Choose, prepare the chosen backends, size the shared workspaces and warm every row (prepare time).
    `only`: one backend for every token count, unchecked (benchmarks time each backend alone; the interpreter's
    tests run CUDA backends on CPU tensors); `warm=False` skips the warm-up runs."""
    if only is None:
        basis, never, decisions = choose(query, entries)
    else:
        basis, never = f"{only.name} alone, as asked for", ()
        decisions = [Decision(1, query.max_tokens, only, "asked for")]
    chosen = list({d.backend for d in decisions})
    common = common_layouts(chosen)
    if common and hasattr(weights, "shared_layout") and weights.shared_layout not in common:
        weights.shared_layout = shared_layout(chosen)  # the one layout every chosen backend reads
    prepared: dict[type[Backend], Backend] = {}
    rows = []
    for d in decisions:
        if d.backend not in prepared:
            prepared[d.backend] = d.backend.prepare(query, weights)
        backend = prepared[d.backend]
        rows += [Row(lo, hi, backend, config, d) for lo, hi, config in backend.configs(d.lo, d.hi)]
    for backend in prepared.values():
        backend.reserve()
    scratch = max(row.backend.scratch_bytes(row.hi, row.config) for row in rows)
    if scratch:
        workspace.reserve_scratch(query.device.device, scratch)
    plan = Plan(query, basis, never, tuple(decisions), tuple(rows))
    key = (query.op, query.format, query.act_mode, query.device.device, query.path, query.n, query.k, plan.summary())
    if key not in _logged:  # once per distinct layer kind
        _logged.add(key)
        logger.info("b12x: %s %s × %s on %s -> %s", query.op, query.format, query.activation, query.device.device,
                    plan.summary())  # fmt: skip
    for row in rows if warm else ():
        if row.backend.warm:
            row.run(*_warm_args(query, row.lo))
    return plan
