"""One plan per prepared op: the only place that chooses what runs.

A `Plan` is an ordered table of token ranges, each with the backend that runs it, that backend's configuration
(tile sizes, accumulator bucket, K splits, ...), why it won and why every other backend lost. `prepare_*` builds it
once (`build`): every backend of the op answers `can_implement(query)`; among those that can, each token range
goes to the fastest backend measured on this GPU (by name, else another of its compute capability) for this
format, activation mode and shape class (timings.py), or, where nothing is measured, to the conservative default
(each backend's `default_tokens`, registry order breaking ties); the chosen backends are prepared, split their
ranges by configuration, size the shared workspaces, and every row is run once (warmed) so no call compiles or
initialises anything.
`linear` / `moe` / `embedding` then run `plan.for_tokens(m).run(...)`.

One copy of the weight: backends read different device layouts of it (`Backend.reads`). Where the fastest
backend per range would need two (the tensor-core GEMM's repacked tiles for small M, the checkpoint layout for
the GEMV or the Triton tiles), the plan keeps the family of backends that share one layout and loses least
against the fastest at the measured token counts (unmeasured: the family of the M=1 default), and explain says
what that costs. `B12X_WEIGHT_COPIES=2`, read when the plan is made, lets every range take its fastest backend.
"""

from __future__ import annotations

import logging

import torch

from .. import workspace
from ..backends import Backend, Query
from ..backends.base import UNBOUNDED
from ..errors import BackendWithdrawn
from .choosing import choose, warn_if_not_built
from .copies import common_layouts, one_copy, shared_layout, weight_copies
from .table import Decision, Plan, Row
from .text import format_config

logger = logging.getLogger("b12x_core")
_logged: set = set()  # layer kinds whose plan has been logged


def preview(query: Query, entries=None) -> Plan:
    """The plan prepare_* would build for `query`, without preparing anything (its rows cannot run): what a GPU
    that is not here would run (docs, tests, planning a deployment)."""
    basis, never, decisions = choose(query, entries)
    layout = shared_layout(list({d.backend for d in decisions}))
    rows = [Row(lo, hi, d.backend, config, d) for d in decisions for lo, hi, config in d.backend.configs(
        query, d.lo, d.hi, layout)]  # fmt: skip
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
    layout = shared_layout(chosen)  # the one layout every chosen backend reads (None: each its own)
    if hasattr(weights, "shared_layout"):  # a linear's weights: what dequantize + cuBLAS reads follows them
        if layout and weights.shared_layout not in common_layouts(chosen):
            weights.shared_layout = layout
        layout = weights.shared_layout
    prepared: dict[type[Backend], Backend] = {}
    rows = []
    for d in decisions:
        if d.backend not in prepared:
            try:
                prepared[d.backend] = d.backend.prepare(query, weights)
            except BackendWithdrawn:  # its first-use check failed: it now declines, so choose again without it
                if only is not None:
                    raise
                return build(query, weights, entries, None, warm)
        backend = prepared[d.backend]
        rows += [Row(lo, hi, backend, config, d) for lo, hi, config in d.backend.configs(query, d.lo, d.hi, layout)]
    for backend in prepared.values():
        backend.reserve([(row.lo, row.hi, row.config) for row in rows if row.backend is backend])
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


__all__ = ["UNBOUNDED", "Decision", "Plan", "Row", "build", "choose", "common_layouts", "format_config", "one_copy",
           "preview", "shared_layout", "warn_if_not_built", "weight_copies"]  # fmt: skip
