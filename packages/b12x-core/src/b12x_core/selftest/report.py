"""The self-test's screen and its JSON: the GPU, a table per family (a row per backend × activation mode, a column per
format: PASS, FAIL, skip, or · where the backend does not run that pair), what failed and why, what did not run
and why, and the path the plans would take. Rendering reads results only, so it is tested on made-up ones."""

from __future__ import annotations

import textwrap

import b12x_formats as bf

from .checks import FAMILIES, TOKENS
from .paths import LAYER, PATH_TOKENS, Path
from .run import Result

WIDTH = 110  # long reasons wrap at this width
CELL = {"pass": "PASS", "fail": "FAIL", "skip": "skip"}


def device_lines(facts: dict) -> list[str]:
    """facts: name, arch, sms, smem_kb, torch, triton, kernels (what the CUDA extension holds, or why none)."""
    return [
        f"GPU: {facts['name']} ({facts['arch']}, {facts['sms']} SMs, {facts['smem_kb']} KB shared memory a block)",
        f"torch {facts['torch']}, Triton {facts['triton']}; b12x CUDA kernels: {facts['kernels']}",
    ]


def family_table(results: list[Result], family: str) -> list[str]:
    """One family's rows (backend × mode) by format, then the backends that run nothing here, grouped by reason."""
    here = [r for r in results if r.check.family == family]
    ran = [r for r in here if r.check.format]
    if not here:
        return []
    formats = [f for f in bf.FORMATS if any(r.check.format == f for r in ran)]
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for r in ran:
        rows.setdefault((r.check.backend, r.check.mode), {})[r.check.format] = CELL[r.status]
    name_w = max([len(b) for b, _ in rows] + [len(family) - 2, 7])
    mode_w = max([len(m) for _, m in rows] + [4])
    widths = [max(len(f), 4) for f in formats]
    out = [f"{family:<{name_w + mode_w + 4}}" + " ".join(f"{f:<{w}}" for f, w in zip(formats, widths, strict=True))]
    for (backend, mode), cells in rows.items():
        line = f"  {backend:<{name_w}} {mode:<{mode_w}} "
        out.append(line + " ".join(f"{cells.get(f, '·'):<{w}}" for f, w in zip(formats, widths, strict=True)))
    reasons: dict[str, list[str]] = {}
    for r in here:
        if not r.check.format:
            reasons.setdefault(r.detail, []).append(r.check.backend)
    for reason, names in reasons.items():
        out += textwrap.wrap(f"not here: {', '.join(names)}: {reason}", WIDTH, initial_indent="  ",
                             subsequent_indent="    ")  # fmt: skip
    return [line.rstrip() for line in out]


def failure_lines(results: list[Result]) -> list[str]:
    out = []
    for r in results:
        if r.status == "fail":
            out += textwrap.wrap(f"FAIL {r.check.name}: {r.detail}", WIDTH, subsequent_indent="    ")
    return out


def not_run_lines(results: list[Result]) -> list[str]:
    """Checks that could run here but did not (a time budget, a lost CUDA context), grouped by why."""
    why: dict[str, int] = {}
    for r in results:
        if r.status == "skip" and r.check.format:
            why[r.detail] = why.get(r.detail, 0) + 1
    return [f"skip ({n} check{'s' if n > 1 else ''}): {reason}" for reason, n in why.items()]


def path_lines(paths: list[Path]) -> list[str]:
    name, n, k = LAYER
    label_w = max(len(f"{p.format} × {p.mode}") for p in paths)
    cols = [max([len(f"M={m}")] + [len(p.backends[i]) for p in paths]) for i, m in enumerate(PATH_TOKENS)]
    head = " ".join(f"{'M=' + str(m):<{w}}" for m, w in zip(PATH_TOKENS, cols, strict=True))
    out = [f"The plans' path here, on {name} (N={n}, K={k}), by tokens per call:",
           f"  {'format × mode':<{label_w}} {head} from"]  # fmt: skip
    for p in paths:
        cells = " ".join(f"{b or '—':<{w}}" for b, w in zip(p.backends, cols, strict=True))
        out.append(f"  {p.format + ' × ' + p.mode:<{label_w}} {cells} {p.basis}"[: WIDTH + 40].rstrip())
    return out


def counts(results: list[Result]) -> dict[str, int]:
    return {
        "passed": sum(r.status == "pass" for r in results),
        "failed": sum(r.status == "fail" for r in results),
        "not run": sum(r.status == "skip" and bool(r.check.format) for r in results),
        "backends that cannot run here": sum(not r.check.format for r in results),
    }


def summary(results: list[Result], seconds: float, seed: int) -> str:
    c = counts(results)
    parts = [f"{c['passed']} passed", f"{c['failed']} failed"]
    if c["not run"]:
        parts.append(f"{c['not run']} not run")
    if n := c["backends that cannot run here"]:
        parts.append(f"{n} backend{'s' if n > 1 else ''} that cannot run here")
    tokens = ", ".join(map(str, TOKENS))
    return f"{', '.join(parts)}, in {seconds:.0f} s ({tokens} tokens a call; inputs from seed {seed}: --seed {seed})"


def screen(facts: dict, results: list[Result], paths: list[Path], seconds: float, seed: int) -> str:
    out = ["b12x self-test: each backend alone against the exact CPU reference", *device_lines(facts), ""]
    for family in FAMILIES:
        table = family_table(results, family)
        out += [*table, ""] if table else []
    notes = failure_lines(results) + not_run_lines(results)
    out += [*notes, ""] if notes else []
    out += [*path_lines(paths), "", summary(results, seconds, seed)]
    if counts(results)["failed"]:
        out.append("A check failed: please report it with this screen and the file --json FILE writes.")
    return "\n".join(out) + "\n"


def as_json(facts: dict, results: list[Result], paths: list[Path], seconds: float, seed: int) -> dict:
    return {
        "device": facts,
        "seed": seed,
        "seconds": round(seconds, 2),
        "tokens": list(TOKENS),
        "counts": counts(results),
        "results": [
            {
                "family": r.check.family,
                "backend": r.check.backend,
                "format": r.check.format,
                "activation": r.check.activation,
                "mode": r.check.mode,
                "status": r.status,
                "detail": r.detail,
                "error": r.error,
                "seconds": round(r.seconds, 3),
            }
            for r in results
        ],  # fmt: skip
        "paths": [
            {
                "format": p.format,
                "activation": p.activation,
                "mode": p.mode,
                "basis": p.basis,
                "backends": dict(zip(map(str, PATH_TOKENS), p.backends, strict=True)),
            }
            for p in paths
        ],  # fmt: skip
    }
