"""The command line: `b12x-selftest [--json FILE] [--quick] [--only TEXT] [--budget SECONDS] [--seed N]`."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import torch

import b12x_formats as bf

from .. import kernels
from .._checks import resolve_device
from ..backends import DeviceInfo, for_op
from . import checks as checklist
from . import paths as plan_paths
from . import report
from .run import Result, lost_context, run

DESCRIPTION = """Checks b12x's kernels on this GPU: each linear and MoE backend alone, on every weight format ×
activation mode it runs here, and the embedding, against b12x-core's exact CPU reference at 1, 7 and 64 tokens
(the fast GPU tier of b12x's tests), and prints the path the plans would take. Exit status 0 when every check that
ran passed, 1 when one failed."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="b12x-selftest", description=DESCRIPTION)
    ap.add_argument("--json", metavar="FILE", type=Path, help="also write the results, device and paths to FILE")
    ap.add_argument("--quick", action="store_true",
                    help="per backend and format one activation mode (bf16 where it runs, else its first): the fast "
                         "tier's cases, about half as many")  # fmt: skip
    ap.add_argument("--only", metavar="TEXT", action="append", default=[],
                    help="run the checks whose name (as 'linear tensor_core NVFP4 × nvfp4') contains TEXT; "
                         "repeatable")  # fmt: skip
    ap.add_argument("--budget", metavar="SECONDS", type=float, default=None,
                    help="start no check after this many seconds (the rest are reported as not run)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=None, help="the random inputs' seed (default: a new one, printed)")
    ap.add_argument("--device", default="cuda", help="the CUDA device to check (default: the current one)")
    args = ap.parse_args(argv)
    if args.budget is not None and args.budget < 0:
        ap.error("--budget must be ≥ 0")
    return args


def device_facts(info: DeviceInfo) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError as err:
        triton_version = f"not importable ({err})"
    built = kernels.built()
    return {
        "name": info.name,
        "arch": info.arch,
        "capability": list(info.capability) if info.capability else None,
        "sms": info.sms,
        "smem_kb": info.smem_kb,
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda})",
        "triton": triton_version,
        "kernels": f"built for {', '.join(kernels.compiled_archs())}" if built else kernels.not_built_reason(),
    }


def no_gpu_text() -> str:
    """What the self-test would check, where there is no GPU to check it on."""
    tokens = ", ".join(map(str, checklist.TOKENS))
    out = ["b12x self-test: each backend alone against the exact CPU reference",
           f"On a CUDA GPU it checks, at {tokens} tokens a call, each of these backends on every weight format ×",
           "activation mode it runs there:"]  # fmt: skip
    for family in checklist.FAMILIES:
        names = [cls.name for cls in for_op(family) if not cls.name.startswith("reference")]
        out += textwrap.wrap(f"{family}: {', '.join(names)}", report.WIDTH, initial_indent="  ",
                             subsequent_indent="    ")  # fmt: skip
    out += [f"  formats: {', '.join(bf.FORMATS)}",
            "and prints the path the plans would take there for every linear format × mode.",
            "no CUDA GPU: nothing to check"]  # fmt: skip
    return "\n".join(out) + "\n"


def selected(all_checks: list[checklist.Check], only: list[str]) -> list[checklist.Check]:
    return [c for c in all_checks if not only or any(text in c.name for text in only)]


def run_all(todo: list[checklist.Check], device: torch.device, seed: int, budget: float | None) -> list[Result]:
    """Each check in order with its own generator (seed, its name): --only with the same seed repeats its inputs.
    After a CUDA error that leaves the context unusable, and once the budget is spent, the rest are not run."""
    from tqdm import tqdm

    start, stop, results = time.monotonic(), "", []
    runnable = sum(not c.skip for c in todo)
    with tqdm(total=runnable, file=sys.stderr, disable=None, unit="check", leave=False) as bar:  # off when no TTY
        for check in todo:
            if check.skip:
                results.append(run(check, device, np.random.default_rng(seed)))
                continue
            if not stop and budget is not None and time.monotonic() - start > budget:
                stop = f"not run: the time budget (--budget {budget:g} s) was spent"
            if stop:
                results.append(Result(check, "skip", stop))
            else:
                bar.set_postfix_str(check.name)
                rng = np.random.default_rng([seed, zlib.crc32(check.name.encode())])
                results.append(result := run(check, device, rng))
                if result.status == "fail" and lost_context(result.detail):
                    stop = f"not run: {check.name} left the CUDA context unusable"
            bar.update(1)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**32)
    if not torch.cuda.is_available():
        sys.stdout.write(no_gpu_text())
        if args.json:
            args.json.write_text(json.dumps({"device": None, "seed": seed, "results": [], "paths": []}, indent=1))
        return 0
    device = resolve_device(args.device)
    info = DeviceInfo.of(device)
    todo = selected(checklist.checks(info, all_modes=not args.quick), args.only)
    start = time.monotonic()
    results = run_all(todo, device, seed, args.budget)
    seconds = time.monotonic() - start
    facts, paths = device_facts(info), plan_paths.paths(info)
    sys.stdout.write(report.screen(facts, results, paths, seconds, seed))
    if args.json:
        args.json.write_text(json.dumps(report.as_json(facts, results, paths, seconds, seed), indent=1) + "\n")
    return 1 if any(r.status == "fail" for r in results) else 0
