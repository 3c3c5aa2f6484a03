"""Choosing: which backend runs each token range of a query, from the backends' `can_implement`, the measured
tables (timings.py) or the conservative defaults, under the one-copy rule (copies.py)."""

from __future__ import annotations

import logging

from .. import backends, timings
from ..backends import Backend, Query
from ..errors import UnsupportedError
from .copies import excluded, one_copy
from .table import Decision
from .text import tokens

logger = logging.getLogger("b12x_core")
_logged: set = set()  # what has been said once (the missing CUDA build)


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
        covered = [cls for cls in able if covers(cls, a)]
        winner = covered[0] if covered else able[0]
        span = f"{tokens(a, b - 1)} tokens"
        if covered:
            why = f"default for {span} ({basis_note})"
        else:  # say so, rather than call the first capable backend's pick a default range it does not have
            why = f"default order for {span}, which no default range here covers ({basis_note})"
        lost = []
        for cls in able:
            if cls is winner:
                continue
            if covers(cls, a):
                lost.append((cls.name, f"unmeasured here: the default order puts {winner.name} first"))
            elif not covered:
                lost.append((cls.name, f"{span} in no default range: the default order puts {winner.name} first"))
            else:
                first, last = cls.default_tokens
                own = f"{first}+" if last is None else f"{first}-{last}"
                lost.append((cls.name, f"{span} outside its default range ({own})"))
        out.append(Decision(a, b - 1, winner, why, tuple(lost)))
    return out


def _measured_decisions(able, entry: timings.Entry, hi: int, layout: str | None = None) -> list[Decision]:
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
                if name not in lost:
                    lost[name] = why
                elif not lost[name].endswith(why):  # the same reason in both ranges is said once
                    lost[name] = f"{lost[name]}, {why}"
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
    from .. import kernels

    why = kernels.not_built_reason()
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
    found = timings.lookup(query.device.capability, query.format, query.act_mode, query.n, query.k, entries,
                           op=query.op, device=query.device.name)  # fmt: skip
    if found is None:
        note = f"no measurements for {arch} {query.format} × {query.act_mode}"
        basis = f"conservative defaults ({note})"
        decisions = _default_decisions(able, 1, hi, "unmeasured")
        family, _, cost = one_copy(able, decisions, lambda subset, _: _default_decisions(subset, 1, hi, "unmeasured"))
        if family is None:
            return basis, never, decisions
        return f"{basis}; {cost}", never, excluded(_merge(_default_decisions(family, 1, hi, "unmeasured")), able,
                                                    family)  # fmt: skip
    entry, note = found
    where = timings.measured_on(entry, query.device.name)
    basis = (f"measured on {where}, shape class {entry.shape} ({entry.source}){'; ' + note if note else ''}; "
             f"per range the fastest at its last measured M (µs; ~ interpolated, ≤ bounded by a larger M's time, "
             f"? unmeasured)")  # fmt: skip
    decisions = _measured_decisions(able, entry, hi)
    family, layout, cost = one_copy(able, decisions, lambda subset, lay: _measured_decisions(subset, entry, hi, lay),
                                    entry)  # fmt: skip
    if family is None:
        return basis, never, decisions if layout is None else _measured_decisions(able, entry, hi, layout)
    return f"{basis}; {cost}", never, excluded(_measured_decisions(family, entry, hi, layout), able, family)
