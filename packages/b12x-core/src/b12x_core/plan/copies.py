"""The one-copy rule: a prepared op holds its weight in one device layout unless B12X_WEIGHT_COPIES=2. Backends say
which layouts they read (`Backend.reads`); where the fastest backends per range would need two, the plan keeps the
family that shares one layout and loses least (see one_copy)."""

from __future__ import annotations

import math
import os

from ..backends import Backend
from .table import Decision


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
    a subset, with each backend's times on that layout (timings.Entry.time). Each layout's family is the
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
            elif t_best:  # the family has nothing measured here: unknown, never free
                return math.inf
        return ratio

    costs = {layout: worst(fam, layout) for layout, fam in families.items() if fam}
    layout = min(costs, key=lambda lay: (costs[lay], lay != shared))
    if layout == shared and costs[layout] == 1.0:
        return None, shared, ""  # the fastest per range share this layout and lose nothing on it
    cost = (f"one weight copy ({layout} layout): at most {costs[layout]:.2f}× the fastest backend at the measured M "
            "(B12X_WEIGHT_COPIES=2 holds two copies for that)")  # fmt: skip
    return families[layout], layout, cost


def excluded(decisions: list[Decision], able, family) -> list[Decision]:
    """The decisions, each listing the capable backends left out for needing another copy of the weight."""
    out = tuple((cls.name, f"would hold a second copy of the weight ({' or '.join(cls.reads)} layout)")
                for cls in able if cls not in family)  # fmt: skip
    return [Decision(d.lo, d.hi, d.backend, d.why, d.lost + out) for d in decisions]
