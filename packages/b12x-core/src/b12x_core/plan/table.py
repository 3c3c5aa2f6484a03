"""The plan's table: token ranges (`Decision`: which backend and why), their prepared rows (`Row`: backend and
configuration) and the `Plan` that looks a call's row up."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..backends import Backend, Config, Query
from ..errors import UnsupportedError
from . import memory, text


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
    """A token range, its prepared backend (a preview's rows: the backend class; they cannot run) and that
    backend's configuration."""

    lo: int
    hi: int
    backend: Backend | type[Backend]
    config: Config
    decision: Decision = field(repr=False)

    def run(self, *args):
        return self.backend.run(*args, config=self.config)


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
        """e.g. "cuda_gemv (1-4), triton_tiles (5-32), dequant_gemm (33-8192)"; one name when one backend."""
        if len(self.decisions) == 1:
            return self.decisions[0].backend.name
        return ", ".join(f"{d.backend.name} ({text.tokens(d.lo, d.hi)})" for d in self.decisions)

    def held_bytes(self) -> int:
        """Bytes of memory the plan's prepared backends hold (memory.held_bytes). 0 for a preview."""
        return memory.held_bytes(self.rows)

    def explain(self, header: str, m: int | None = None) -> str:
        return text.explain(self, header, m)
