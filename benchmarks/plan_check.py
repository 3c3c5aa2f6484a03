"""Does the plan pick the fastest b12x path? Every candidate backend alone and the dispatched bc.linear, on
Llama-3.1-8B's and -70B's four linear shapes, every format × activation mode, over M; the measured table the plan
picks from comes out of the same run.

    python benchmarks/plan_check.py --out plan_check.json --png plan_check.png [--emit-table timings.json]
    python benchmarks/plan_check.py --formats NVFP4,FP8 --shapes 8b,70b.down --ms 1,16,256 --replays 20
    python benchmarks/plan_check.py --activations "fp8 static,mxfp8,nvfp4" --ms 1,2,4,8  # quantized modes only
    python benchmarks/plan_check.py --emit-table packages/b12x-core/src/b12x_core/timings.json  # table + check
    python benchmarks/plan_check.py --table-only --emit-table timings.json   # backends alone: the table only
    python benchmarks/plan_check.py --from-json plan_check.json --emit-table timings.json  # a saved run's table
    python benchmarks/plan_check.py --cpu-smoke         # the script's logic on CPU, a tiny shape, the reference

For each shape × (format, activation) × M: the time of each backend that can run the pair on this GPU (a plan of
that backend alone; one over PRUNE× the fastest and falling further behind is not timed at larger M, but the
largest), the dispatched time (bc.prepare_linear's plan) and bf16 F.linear, all in this run; per model, the decoder
layer's four linears summed. Timing as
benchmarks/decode_linear.py: CUDA graphs over weight copies larger than L2 together, median of the replays. The
check printed at the end: dispatched ≤ 1.15 × the fastest b12x backend at every point. `--emit-table` merges the
per-backend times into a timing table, one entry per shape (a shape class: timings.py) of this GPU (its name),
replacing entries of the same key (another GPU's stay), as each format × mode is measured: given b12x_core's own
table, the dispatched op of that pair is prepared afterwards, so the run checks the plan its own measurements give.
Commit that file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import decode_linear
import numpy as np
import torch
import torch.nn.functional as F
from decode_linear import device_facts, reuse_repacks, time_graph

import b12x_core as bc
import b12x_formats as bf
from b12x_core import backends, plan, timings
from b12x_core.weights import DeviceWeights, as_shards

MODELS = {  # a decoder layer's four linears (qkv and gate_up fused, as vLLM runs them)
    "8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)},
    "70b": {"qkv": (10240, 8192), "o": (8192, 8192), "gate_up": (57344, 8192), "down": (8192, 28672)},
}
SHAPES = {f"{model}.{name}": shape for model, shapes in MODELS.items() for name, shape in shapes.items()}
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]
PRUNE = 3.0  # a backend this many times slower than the fastest, and falling further behind, is not timed beyond
NOISE = 0.05  # "further behind" means by more than the run-to-run spread of one point (±5% on the H200)
BUDGET_MS = 80  # replays of one point beyond this much GPU time add nothing to its median (at least 5 run)
# (format, activation, with input_scale): every format with bf16, every quantized activation mode
PAIRS = [(f, "bf16", False) for f in bf.FORMATS if f != "W4A16_NVFP4"] + [
    ("FP8", "fp8", True), ("FP8", "fp8", False), ("FP8_BLOCK", "fp8", False), ("MXFP8", "mxfp8", False),
    ("MXFP4", "mxfp8", False), ("NVFP4", "mxfp8", False), ("NVFP4", "nvfp4", True),
]  # fmt: skip
TOLERANCE = 1.15
L2_BYTES = 60 * 1024**2


def timed(backend: str, m: int, pruned: set[str], top: int) -> bool:
    """Whether a backend is timed at M: unless pruned, and always at the largest M (a pass whose cost is flat in M,
    dequantize + GEMM, falls behind at small M and wins at the largest; a table without it there sends those tokens
    to another backend)."""
    return backend not in pruned or m == top


def falling_behind(ratios: dict[str, float], before: dict[str, float]) -> set[str]:
    """The backends not worth timing at larger M: over PRUNE× the fastest and further behind than at the previous M
    by more than the noise (the GEMV grows with M; dequantize + GEMM's fixed cost, flat in M, falls behind the tiles
    only by noise until it wins: on 12-02 a 0.03% step dropped it for MXFP8 from M = 16, where it is fastest from
    M = 128)."""
    return {b for b, r in ratios.items() if r > PRUNE and b in before and r > before[b] * (1 + NOISE)}


def label(fmt: str, activation: str, scale: bool) -> str:
    return f"{fmt} × {activation}" + (" static" if scale and activation == "fp8" else "")


class Timer:
    """µs per call of fn(i) over weight copies i: CUDA graph replays on a GPU (decode_linear.time_graph), wall
    clock on the CPU smoke run."""

    def __init__(self, device: torch.device, replays: int):
        self.device, self.replays = device, replays

    def __call__(self, fn, copies: int) -> float:
        if self.device.type != "cuda":
            times = []
            for _ in range(self.replays):
                start = time.perf_counter()
                for i in range(copies):
                    fn(i)
                times.append((time.perf_counter() - start) * 1e6 / copies)
            return statistics.median(times)
        return time_graph(fn, copies, replays=self.replays, budget_ms=BUDGET_MS)


def random_weight(fmt: str, n: int, k: int, input_scale: bool) -> bf.QuantizedWeight:
    """Valid random checkpoint tensors (decode_linear.random_weight), with a static activation scale if asked."""
    qw = decode_linear.random_weight(fmt, n, k)
    if input_scale:
        qw = bf.QuantizedWeight.from_tensors(fmt, {**qw.tensors, "input_scale": np.float32(0.02)})
    return qw


def copies_for(nbytes: int, device: torch.device) -> int:
    return max(2, -(-4 * L2_BYTES // nbytes)) if device.type == "cuda" else 1


def layout_names(cls, able) -> dict[str, str]:
    """Layout -> the table's name for `cls` timed on it: its first layout under its own name, another one (that
    some other capable backend shares) as "name@layout" (timings.Entry.time)."""
    shared = {layout for other in able if other is not cls for layout in other.reads}
    return {layout: cls.name if i == 0 else f"{cls.name}@{layout}" for i, layout in enumerate(cls.reads)
            if i == 0 or layout in shared}  # fmt: skip


def measure_pair(timer, device, name, n, k, pair, ms, rows, args) -> None:
    """Each capable backend alone (on each layout it reads), then, with that table merged in (--emit-table), the
    dispatched op: the plan the new measurements give, checked in the same run."""
    fmt, activation, scale = pair
    qw = random_weight(fmt, n, k, scale)
    copies = copies_for(qw.nbytes, device)
    top = max(ms)
    probe = bc.prepare_linear(qw, device=device, max_tokens=top, activation=activation)  # its query
    query, input_scale = probe.plan.query, probe.input_scale
    del probe
    able = [cls for cls in backends.for_op("linear") if cls.can_implement(query)[0]]
    single = {}
    for cls in able:  # each backend alone, in its own weight copies, on each layout it reads
        for layout, label_ in layout_names(cls, able).items():
            weights = [DeviceWeights(as_shards(qw), query.act_mode, input_scale, device) for _ in range(copies)]
            for w in weights:
                w.shared_layout = layout
            single[label_] = [plan.build(query, w, only=cls) for w in weights]
    pruned: set[str] = set()
    behind: dict[str, float] = {}  # each backend's time over the fastest's at the previous M
    mine = []
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
        row = dict(shape=name, n=n, k=k, format=fmt, activation=activation, static=scale, mode=query.act_mode, m=m)
        row["backends"], row["timed_at"] = {}, {}
        for b, plans in single.items():
            if timed(b, m, pruned, top):
                row["backends"][b] = timer(lambda i, p=plans: p[i].for_tokens(m).run(x, None), copies)
                # wall clock at the end of its timing: joins the clocks / power / temperature log that
                # tools/measure_tables.sh keeps (one timing of a full run measured 1.2x its time alone)
                row["timed_at"][b] = round(time.time(), 1)
        fastest = min(row["backends"].values())
        ratios = {b: t / fastest for b, t in row["backends"].items()}
        pruned |= falling_behind(ratios, behind)
        behind = ratios
        mine.append(row)
    single.clear()
    if args.emit_table:  # the dispatched plan below reads the new entry (when the table is b12x_core's own)
        facts = device_facts(device)
        timings.merge(Path(args.emit_table), table(mine, facts["capability"], facts["device"], facts["date"]))
        timings.load.cache_clear()
    dispatched = [bc.prepare_linear(qw, device=device, max_tokens=top, activation=activation)
                  for _ in range(1 if args.table_only else copies)]  # fmt: skip
    layout = dispatched[0].plan.rows[0].backend.weights.shared_layout  # the plan's one copy of the weight
    one_copy = [layout_names(cls, able).get(layout) for cls in able if layout in cls.reads]
    for row in mine:
        m = row["m"]
        if not args.table_only:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            row["dispatched"] = timer(lambda i: bc.linear(x, dispatched[i]), copies)
            row["timed_at"]["dispatched"] = round(time.time(), 1)
        row["dispatched_backend"] = dispatched[0].plan.for_tokens(m).backend.name
        row["one_copy"] = [b for b in one_copy if b in row["backends"]]  # what the plan could pick from
        rows.append(row)
        alone = " ".join(f"{b}={t:.1f}" for b, t in row["backends"].items())
        took = f"dispatched {row['dispatched']:>9.1f} µs" if "dispatched" in row else "plan"
        print(f"  {label(*pair):<22} M={m:<5} {took} ({row['dispatched_backend']}) "
              f"fastest {min(row['backends'].values()):>9.1f} {alone}", flush=True)  # fmt: skip


def shapes_of(spec: str) -> dict[str, tuple[int, int]]:
    """--shapes: model names (every linear of its layer) and/or model.linear names."""
    out = {}
    for part in spec.split(","):
        out |= {f"{part}.{n}": s for n, s in MODELS[part].items()} if part in MODELS else {part: SHAPES[part]}
    return out


def measure(args, device: torch.device) -> list[dict]:
    timer = Timer(device, args.replays)
    rows: list[dict] = []
    shapes = {"tiny": (256, 512)} if args.cpu_smoke else shapes_of(args.shapes)
    formats = set(args.formats.split(",")) if args.formats else None
    activations = set(args.activations.split(",")) if args.activations else None  # as labels name them
    pairs = [p for p in PAIRS if (formats is None or p[0] in formats)
             and (activations is None or label(*p).split(" × ")[1] in activations)]  # fmt: skip
    ms = [int(m) for m in args.ms.split(",")]
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    for name, (n, k) in shapes.items():
        print(f"\n## {name} {n}×{k} on {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}")
        bf16_w = [torch.randn(n, k, dtype=torch.bfloat16, device=device) for _ in range(copies_for(2 * n * k, device))]
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            t = timer(lambda i: F.linear(x, bf16_w[i]), len(bf16_w))
            at = {"dispatched": round(time.time(), 1)}  # as the pairs' rows keep it
            rows.append(dict(shape=name, n=n, k=k, format="bf16 F.linear", m=m, dispatched=t, timed_at=at))
            print(f"  bf16 F.linear          M={m:<5} {t:>9.1f} µs", flush=True)
        bf16_w.clear()
        for pair in pairs:
            if deadline is not None and time.monotonic() > deadline:
                print(f"  time budget of {args.budget_s} s spent: stopping before {name} {label(*pair)}")
                return rows
            measure_pair(timer, device, name, n, k, pair, ms, rows, args)  # its weight copies are freed on return
            if args.out:  # after every pair: a run cut short still leaves its measurements (--from-json reads them)
                with open(args.out, "w") as f:
                    json.dump({**device_facts(device), "rows": rows, "partial": True}, f)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def layers(rows: list[dict]) -> list[dict]:
    """Per model, format × mode and M: the decoder layer's four linears summed (dispatched and bf16), where every
    linear of the layer was measured."""
    out = []
    for model, shapes in MODELS.items():
        names = {f"{model}.{n}" for n in shapes}
        here = [r for r in rows if r["shape"] in names and "dispatched" in r]
        for m in sorted({r["m"] for r in here}):
            base = [r["dispatched"] for r in here if r["m"] == m and r["format"] == "bf16 F.linear"]
            if len(base) != len(names):
                continue
            for key in dict.fromkeys((r["format"], r["activation"], r["static"]) for r in here if "backends" in r):
                times = [r["dispatched"] for r in here if r["m"] == m and "backends" in r
                         and (r["format"], r["activation"], r["static"]) == key]  # fmt: skip
                if len(times) == len(names):
                    out.append(dict(model=model, label=label(*key), m=m, us=sum(times), bf16_us=sum(base),
                                    speedup=sum(base) / sum(times)))  # fmt: skip
    return out


def check(rows: list[dict]) -> bool:
    """Dispatched within TOLERANCE of the fastest backend that reads the plan's one copy of the weight (the plan
    gives up the others for memory, and its basis says by how much; B12X_WEIGHT_COPIES=2 checks all)."""
    points = [r for r in rows if "backends" in r and r["backends"] and "dispatched" in r]

    def candidates(r):
        return {b: t for b, t in r["backends"].items() if b in r.get("one_copy", r["backends"])} or r["backends"]

    bad = [r for r in points if r["dispatched"] > TOLERANCE * min(candidates(r).values())]
    print(f"\n## check: dispatched ≤ {TOLERANCE}× the fastest b12x backend on the plan's weight copy at "
          f"{len(points) - len(bad)}/{len(points)} points")  # fmt: skip
    for r in bad:
        best = min(candidates(r), key=candidates(r).get)
        print(f"  MISS {r['shape']} {r['format']} × {r['mode']} M={r['m']}: dispatched {r['dispatched']:.1f} µs "
              f"({r['dispatched_backend']}), {best} {r['backends'][best]:.1f} µs")  # fmt: skip
    return not bad


def table(rows: list[dict], capability, device_name: str, day: str) -> list[timings.Entry]:
    """Per (format, mode, shape): each backend's µs at each M (the mean where a shape was measured twice), as
    measured on the GPU named `device_name` (the table keys entries by it)."""
    groups = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in rows:
        if "backends" not in r:
            continue
        key = (r["format"], r["mode"], timings.shape_class(r["n"], r["k"]))
        for b, t in r["backends"].items():
            groups[key][b][r["m"]].append(t)
    entries = []
    for (fmt, mode, shape), per_backend in sorted(groups.items()):
        ms = sorted({m for times in per_backend.values() for m in times})
        us = {b: [round(statistics.mean(times[m]), 2) if m in times else None for m in ms]
              for b, times in per_backend.items()}  # fmt: skip
        source = f"{device_name} {day}, {shape.replace('x', '×')}, benchmarks/plan_check.py"
        entries.append(timings.Entry(tuple(capability), fmt, mode, shape, tuple(ms), us, source, device=device_name))
    return entries


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 5), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        base = {r["m"]: r["dispatched"] for r in rows if r["shape"] == shape and r["format"] == "bf16 F.linear"}
        pairs = dict.fromkeys((r["format"], r["activation"], r["static"]) for r in rows if r["shape"] == shape
                              and "backends" in r)  # fmt: skip
        for pair in pairs:
            pts = [(r["m"], base[r["m"]] / r["dispatched"]) for r in rows if r["shape"] == shape and "dispatched" in r
                   and "backends" in r and (r["format"], r["activation"], r["static"]) == pair]  # fmt: skip
            ax.plot(*zip(*pts, strict=True), marker=".", label=label(*pair))
        ax.axhline(1.0, color="k", lw=1, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{shape}: dispatched speed-up over bf16 F.linear")
        ax.set_xlabel("M (tokens)")
    axes[0][0].legend(ncol=2, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="plan_check.json")
    parser.add_argument("--png", default="plan_check.png")
    parser.add_argument("--emit-table", default="", help="write the measured timing table here")
    parser.add_argument("--shapes", default="8b,70b", help=f"models ({','.join(MODELS)}) and/or {','.join(SHAPES)}")
    parser.add_argument("--formats", default="", help="subset of the formats (default: all)")
    parser.add_argument("--activations", default="",
                        help='subset of the activation modes, as the labels name them: bf16, "fp8 static", fp8 '
                        "(per token or per group), mxfp8, nvfp4 (default: all)")  # fmt: skip
    parser.add_argument("--ms", default=",".join(map(str, MS)))
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--table-only", action="store_true", help="time the backends alone, not the dispatched op")
    parser.add_argument("--budget-s", type=float, default=0, help="start no new format after this many seconds")
    parser.add_argument("--from-json", default="", help="no measuring: the check and table of a saved --out file")
    parser.add_argument("--cpu-smoke", action="store_true", help="the logic on CPU: a tiny shape, the reference")
    args = parser.parse_args()
    if args.cpu_smoke:
        args.ms, args.replays = "1,2,4", 2
    if args.from_json:  # a run cut short, or one copied from a GPU machine: its rows as they were saved
        saved = json.loads(Path(args.from_json).read_text())
        rows, name, capability, day = saved["rows"], saved["device"], tuple(saved["capability"]), saved["date"]
        args.out = args.out if args.out != parser.get_default("out") else ""
    else:
        device = torch.device("cpu") if args.cpu_smoke else torch.device("cuda", torch.cuda.current_device())
        torch.manual_seed(0)
        reuse_repacks()
        rows = measure(args, device)
        facts = device_facts(device)
        name, capability, day = facts["device"], tuple(facts["capability"]), facts["date"]
    per_layer = layers(rows)
    if args.out:
        with open(args.out, "w") as f:
            saved = {"device": name, "capability": list(capability), "date": day, "rows": rows, "layers": per_layer}
            json.dump(saved, f, indent=1)
    for r in per_layer:
        print(f"  layer {r['model']:<4} {r['label']:<22} M={r['m']:<5} {r['us']:>9.1f} µs  {r['speedup']:.2f}× bf16")
    if args.png and any("dispatched" in r and "backends" in r for r in rows):
        plot(rows, args.png)
    ok = check(rows)
    if args.emit_table and args.from_json:  # a measuring run merged each pair's entry as it went
        timings.merge(Path(args.emit_table), table(rows, capability, name, day))
    if args.emit_table:
        print(f"measured table merged into {args.emit_table}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
