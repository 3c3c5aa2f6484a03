"""Fused MoE on the GPU: b12x beside a bf16 grouped MoE (torch routing, two `torch._grouped_mm` GEMMs, SiLU·up,
torch combine), every MoE format × its activation formats, per b12x backend.

    python benchmarks/moe.py --out moe.json --png moe.png [--shapes qwen3,gptoss,dsv3] [--ts 1,4,16,64,256,1024,4096]
        [--cases MXFP4:bf16,NVFP4:nvfp4,...]
        [--backends auto,triton_moe,tensor_core_moe,tensor_core_moe+held,tensor_core_moe_wgmma,cutlass_sm90_moe]
        [--emit-table packages/b12x-core/src/b12x_core/timings.json]

Shapes: qwen3 = Qwen3-30B-A3B-like (E=128, top-8, H=2048, I=768), gptoss = gpt-oss-120b-like (E=128, top-4,
H=2880, I=2880), dsv3 = DeepSeek-V3-like (E=256, top-8, H=7168, I=2048). Routing: random logits, renormalised
top-k. Backends: "auto" is bc.moe (the plan's choice); a backend name runs that backend alone (plan.build only=);
"tensor_core_moe+held" holds its block rows; the suffixes "@loose" (the old block-table size) and "@unfused" (the
table and the combine launched apart from the GEMMs) time A/B forms the table leaves out.
Everything is timed as CUDA-graph replays (median of 100): b12x with two prepared copies alternating, so for
the small shapes the weights are not all L2-resident; the bf16 baseline does its routing (a stable sort, counts
by scatter-add: no host sync) and combine (index_add in float32) inside the graph, as b12x does. At T=1 the
bandwidth floor counts the bytes of the touched experts' weights (FORMATS.md) against the device copy bandwidth
measured in the same run; at large T, TFLOP/s counts the useful FLOPs, 2·T·k·(2I·H + H·I), against cuBLAS bf16
on a [4096, H] × [2I, H] GEMM measured in the same run. `--emit-table` merges the named backends' times into the
plan's timing table as MoE entries (op "moe", per GPU name × format × activation mode × shape class "2IxH"),
replacing entries of the same key, so the plan picks the faster MoE backend per token count.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time
import unittest.mock
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from decode_linear import copy_bandwidth, device_facts, random_weight, reuse_repacks, time_graph

import b12x_core as bc
import b12x_formats as bf
from b12x_core import backends, moe_blocks, plan, timings
from b12x_core.backends import Overrides, tensor_core_moe
from b12x_core.moe import MOE_FORMATS
from b12x_core.tensor_core import configure
from b12x_core.weights import DeviceWeights, as_shards

SHAPES = {"qwen3": (128, 8, 2048, 768), "gptoss": (128, 4, 2880, 2880), "dsv3": (256, 8, 7168, 2048)}
TOLERANCE = 1.15  # the plan check: dispatched within this of the fastest backend on the plan's weight copy
BUDGET_MS = 100  # replays of one point beyond this much GPU time add nothing to its median (at least 5 run)
# This --backends name times tensor_core_moe with its block rows held (Overrides.holds_rows on); the table
# then holds those times under it, and tensor_core_moe holds the rows at the token counts where they are faster.
HELD = configure.HELD
LOOSE = "@loose"  # a backend name's suffix: the same backend with the block tables' old size (backend_moe)
UNFUSED = "@unfused"  # a suffix: tensor_core_moe with the table and the combine launched apart (Overrides.fuses off)


def bf16_grouped_moe(x, weights, ids, w13_t, w2_t, inter):
    """bf16 MoE through torch._grouped_mm: slots sorted by expert, both GEMMs grouped by cumulative counts,
    SiLU·up, router-weighted index_add. w13_t [E, H, 2I] and w2_t [E, I, H] are transposed views (column-major
    B operands, as _grouped_mm takes them)."""
    t, k = ids.shape
    flat = ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    counts = torch.zeros(w13_t.shape[0], dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))  # bincount would sync to size itself
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    tokens = order // k
    h = torch._grouped_mm(x[tokens], w13_t, offs=offs)
    a = F.silu(h[:, :inter]) * h[:, inter:]
    out = torch._grouped_mm(a, w2_t, offs=offs)
    y = torch.zeros(t, w2_t.shape[2], dtype=torch.float32, device=x.device)
    y.index_add_(0, tokens, out.float() * weights.reshape(-1)[order, None])
    return y.to(torch.bfloat16)


def expert_bytes(w13: bf.QuantizedWeight, w2: bf.QuantizedWeight, experts: int, touched: int) -> int:
    return (w13.nbytes + w2.nbytes) // experts * touched


def with_input_scale(w13: bf.QuantizedWeight, w2: bf.QuantizedWeight, experts: int):
    """Both expert weights with the per-expert activation scale an nvfp4 checkpoint carries."""
    scale = {"input_scale": np.full(experts, 0.01, np.float32)}
    return tuple(bf.QuantizedWeight.from_tensors(w.format, {**w.tensors, **scale}) for w in (w13, w2))


def device_weights(p, w13: bf.QuantizedWeight, w2: bf.QuantizedWeight) -> tuple:
    """A fresh device copy of both expert weights in the modes of the prepared MoE `p` (a backend built alone)."""
    return (DeviceWeights(as_shards(w13), p.act_mode_13, p.input_scale_13, p.device),
            DeviceWeights([w2], p.act_mode_2, p.input_scale_2, p.device))  # fmt: skip


def loose_blocks(slots: int, experts: int, rows_per_block: int) -> int:
    """The block table's size before moe_blocks.max_blocks (⌈S/R⌉ + E), for the "@loose" A/B."""
    return -(-slots // rows_per_block) + experts


def loose_tables():
    """Patches the block tables (and the tickets the plan reserves for them) to their old, loose size."""
    stack = contextlib.ExitStack()
    for module in (moe_blocks, tensor_core_moe):
        stack.enter_context(unittest.mock.patch.object(module, "max_blocks", loose_blocks))
    return stack


def backend_moe(p, w13, w2, name: str):
    """-> call(x, weights, ids): bc.moe for "auto", else the named backend alone over p's query and weights
    (tensor_core_moe with its rows staged, HELD with them held: Overrides.holds_rows in the plan's query; a name
    ending "@loose" runs it with the block tables' old size, ⌈T·k / R⌉ + E, one ending "@unfused" with the routing
    table and the combine in launches of their own (Overrides.fuses off): A/Bs the table leaves out)."""
    if name == "auto":
        return lambda x, weights, ids: bc.moe(x, weights, ids, p)
    unfused = name.endswith(UNFUSED)
    name = name.removesuffix(UNFUSED)
    base, loose = name.removesuffix(LOOSE), name.endswith(LOOSE)
    cls = next(c for c in backends.for_op("moe") if c.name == ("tensor_core_moe" if base == HELD else base))
    ok, why = cls.can_implement(p.plan.query)
    if not ok:
        raise bc.UnsupportedError(f"{name}: {why}")
    weights = device_weights(p, w13, w2)
    forced = Overrides(holds_rows=base == HELD, fuses=False if unfused else None)
    query = dataclasses.replace(p.plan.query, overrides=forced)
    with loose_tables() if loose else contextlib.nullcontext():
        alone = plan.build(query, weights, only=cls)
    if not loose:
        return lambda x, weights, ids: alone.for_tokens(x.shape[0]).run(x, weights, ids)

    def call(x, weights, ids):
        with loose_tables():  # the table is made inside the captured call
            return alone.for_tokens(x.shape[0]).run(x, weights, ids)

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen3,gptoss,dsv3")
    parser.add_argument("--ts", default="1,4,16,64,256,1024,4096")
    parser.add_argument("--cases", default=",".join(f"{f}:{a}" for f, acts in MOE_FORMATS.items() for a in acts),
                        help="format:activation pairs")  # fmt: skip
    parser.add_argument("--backends", default="auto,tensor_core_moe", help="auto (bc.moe) and/or backend names")
    parser.add_argument("--out", default="moe.json")
    parser.add_argument("--png", default="moe.png")
    parser.add_argument("--emit-table", default="", help="merge the backends' times into this timing table")
    parser.add_argument("--budget-s", type=float, default=0, help="start no new format after this many seconds")
    parser.add_argument("--from-json", default="", help="no measuring: --emit-table from a saved --out file")
    args = parser.parse_args()
    if args.from_json:
        timings.merge(Path(args.emit_table), table(json.loads(Path(args.from_json).read_text())))
        print(f"MoE entries -> {args.emit_table}")
        return
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    torch.manual_seed(0)
    reuse_repacks()
    bw = copy_bandwidth()
    ts = [int(t) for t in args.ts.split(",")]
    rows = []
    print(f"# {torch.cuda.get_device_name()}: copy bandwidth {bw:.0f} GB/s")
    for shape in args.shapes.split(","):
        if deadline is not None and time.monotonic() > deadline:
            print(f"  time budget of {args.budget_s} s spent: stopping before {shape}")
            break
        e, k, h, inter = SHAPES[shape]
        w13_bf16 = torch.randn(e, 2 * inter, h, dtype=torch.bfloat16, device="cuda") / h**0.5
        w2_bf16 = torch.randn(e, h, inter, dtype=torch.bfloat16, device="cuda") / inter**0.5
        w13_t, w2_t = w13_bf16.transpose(1, 2), w2_bf16.transpose(1, 2)
        a = torch.randn(4096, h, dtype=torch.bfloat16, device="cuda")
        dense_flops = 2 * 4096 * h * 2 * inter
        t_dense = time_graph(lambda i: F.linear(a, w13_bf16[i]), 2)  # cuBLAS bf16 rate on this shape
        dense_tflops = dense_flops / t_dense / 1e6
        print(f"## {shape}: E={e} top-{k} H={h} I={inter}; cuBLAS bf16 {dense_tflops:.0f} TFLOP/s")
        routes = {}
        for t in ts:
            weights, ids = bc.route_topk(torch.randn(t, e, device="cuda"), k)
            x = torch.randn(t, h, dtype=torch.bfloat16, device="cuda")
            ref_us = time_graph(lambda i: bf16_grouped_moe(x, weights, ids, w13_t, w2_t, inter), 1)
            routes[t] = (x, weights, ids, ref_us)
            print(f"  bf16 grouped  T={t:<5} {ref_us:>9.1f} µs", flush=True)
        cases = [case.split(":") for case in args.cases.split(",")]
        for fmt in dict.fromkeys(f for f, _ in cases):
            if deadline is not None and time.monotonic() > deadline:
                print(f"  time budget of {args.budget_s} s spent: stopping before {shape} {fmt}")
                break
            w13 = random_weight(fmt, 2 * inter, h, (e,))
            w2 = random_weight(fmt, h, inter, (e,))
            for act in (a for f, a in cases if f == fmt):
                if act == "nvfp4":  # the checkpoint's per-expert activation scale
                    w13, w2 = with_input_scale(w13, w2, e)
                names = [b for b in args.backends.split(",") if b != "auto"]
                names += ["auto"] if "auto" in args.backends.split(",") else []  # last: after the table has these
                kw = dict(max_tokens=max(ts), top_k=k, act_format=act, device="cuda")
                try:
                    probe = bc.prepare_moe(w13, w2, **kw)  # its query and modes; the backends alone run over them
                except bc.UnsupportedError as err:
                    print(f"  {fmt} × {act}: {err}")
                    continue
                for name in names:
                    if name == "auto" and args.emit_table:  # bc.moe's plan then reads this case's new entry
                        case_rows = [r for r in rows if (r["shape"], r["format"], r["act"]) == (shape, fmt, act)]
                        timings.merge(Path(args.emit_table), table({**device_facts(), "rows": case_rows}))
                        timings.load.cache_clear()
                    try:
                        if name == "auto":
                            preps = [bc.prepare_moe(w13, w2, **kw) for _ in range(2)]
                            calls = [backend_moe(p, w13, w2, name) for p in preps]
                        else:  # two copies of the backend alone
                            calls = [backend_moe(probe, w13, w2, name) for _ in range(2)]
                    except bc.UnsupportedError as err:
                        print(f"  {fmt} × {act} {name}: {err}")
                        continue
                    mode = probe.act_mode_13
                    for t in ts:
                        x, weights, ids, ref_us = routes[t]
                        us = time_graph(lambda i: calls[i](x, weights, ids), 2, budget_ms=BUDGET_MS)
                        touched = int(torch.unique(ids).numel())
                        nbytes = expert_bytes(w13, w2, e, touched)
                        flops = 2 * t * k * (2 * inter * h + h * inter)
                        row = dict(shape=shape, format=fmt, act=act, mode=mode, n=2 * inter, k=h,
                                   backend=name, t=t, us=us, bf16_ref_us=ref_us,
                                   speedup=ref_us / us, touched=touched, gbs=nbytes / us / 1e3,
                                   pct_copy=100 * nbytes / us / 1e3 / bw, tflops=flops / us / 1e6,
                                   pct_cublas=100 * flops / us / 1e6 / dense_tflops)  # fmt: skip
                        if name == "auto":  # what the plan ran, and what it could pick from on its weight copy
                            row["dispatched_backend"] = preps[0].plan.for_tokens(t).backend.name
                            layouts = plan.common_layouts([d.backend for d in preps[0].plan.decisions])
                            row["one_copy"] = [c.name for c in backends.for_op("moe") if layouts & set(c.reads)]
                        rows.append(row)
                        print(f"  {fmt:<12} × {act:<6} {name:<16} T={t:<5} {us:>9.1f} µs  "
                              f"{ref_us / us:>5.2f}× bf16  {row['pct_copy']:>5.1f}% copy  "
                              f"{row['pct_cublas']:>5.1f}% cuBLAS", flush=True)  # fmt: skip
                    save(args.out, bw, rows)  # after each backend: a run cut short keeps what it measured
    saved = save(args.out, bw, rows)
    check(rows)
    if args.png:
        plot(rows, args.png)
    if args.emit_table:
        timings.merge(Path(args.emit_table), table(saved))
        print(f"MoE entries -> {args.emit_table}")


def check(rows: list[dict]) -> bool:
    """The plan check: bc.moe (auto) within TOLERANCE of the fastest backend alone on the plan's weight copy, at
    every T of every shape × format × mode measured with both."""
    alone = {(r["shape"], r["format"], r["act"], r["t"], r["backend"]): r["us"] for r in rows if r["backend"] != "auto"}
    points = []
    for r in (r for r in rows if r["backend"] == "auto"):
        key = (r["shape"], r["format"], r["act"], r["t"])
        mine = {b: alone[(*key, b)] for b in r.get("one_copy", ()) if (*key, b) in alone}
        if mine:
            points.append((r, min(mine, key=mine.get), min(mine.values())))
    bad = [(r, best, t) for r, best, t in points if r["us"] > TOLERANCE * t]
    print(f"\n## check: bc.moe ≤ {TOLERANCE}× the fastest backend on its weight copy at {len(points) - len(bad)}/"
          f"{len(points)} points")  # fmt: skip
    for r, best, t in bad:
        print(f"  MISS {r['shape']} {r['format']} × {r['act']} T={r['t']}: bc.moe {r['us']:.1f} µs "
              f"({r['dispatched_backend']}), {best} {t:.1f} µs")  # fmt: skip
    return not bad


def table(saved: dict) -> list[timings.Entry]:
    """Per (format, mode, shape class): each named backend's µs at each T (the mean where measured twice), from
    what save() wrote, keyed by the GPU it names."""
    rows = saved["rows"]
    groups = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in rows:
        if r["backend"] != "auto" and not r["backend"].endswith((LOOSE, UNFUSED)):
            key = (r["format"], r["mode"], timings.shape_class(r["n"], r["k"]))
            groups[key][r["backend"]][r["t"]].append(r["us"])
    source = f"{saved['device']} {saved['date']}, benchmarks/moe.py"
    entries = []
    for (fmt, mode, shape), per_backend in sorted(groups.items()):
        ts = sorted({t for times in per_backend.values() for t in times})
        us = {b: [round(float(np.mean(times[t])), 2) if t in times else None for t in ts]
              for b, times in per_backend.items()}  # fmt: skip
        entries.append(timings.Entry(tuple(saved["capability"]), fmt, mode, shape, tuple(ts), us, source, op="moe",
                                     device=saved["device"]))  # fmt: skip
    return entries


def save(path: str, bw: float, rows: list) -> dict:
    saved = {**device_facts(), "copy_gbs": bw, "rows": rows}
    with open(path, "w") as f:
        json.dump(saved, f, indent=1)
    return saved


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({r["shape"] for r in rows})
    if not shapes:  # every case was refused for its shape (as IQ2 on gpt-oss's 2880-wide experts): nothing to draw
        print(f"no rows measured: no plot written to {path}")
        return
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        here = [r for r in rows if r["shape"] == shape]
        for series in sorted({(r["format"], r["act"], r.get("backend", "auto")) for r in here}):
            pts = [(r["t"], r["us"]) for r in here if (r["format"], r["act"], r.get("backend", "auto")) == series]
            fmt, act, name = series
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"{fmt} × {act} ({name})")
        ref = sorted({(r["t"], r["bf16_ref_us"]) for r in here})
        ax.plot(*zip(*ref, strict=True), "k--", label="bf16 torch._grouped_mm MoE")
        ax.set(xscale="log", yscale="log", xlabel="tokens T", ylabel="µs", title=shape)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
