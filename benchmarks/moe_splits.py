"""The tensor-core MoE's K splits at decode sizes, measured (needs a CUDA GPU):

    python benchmarks/moe_splits.py --out moe_splits.json [--shapes qwen3,gptoss] [--cases MXFP4:mxfp8,NVFP4:bf16]
        [--ts 1,2,4,8,16]

tensor_core_moe's configuration (b12x_core.tensor_core.configure.moe_config) picks each GEMM's K split by a rule
(configure.even_split: even waves over the SMs, at least 4 chunks a split). Here every split pair (gate/up, down) the
kernels take (up to 8 each, at least 2 chunks a split) runs at each T with the rest of the call's configuration as the
plan has it (token tile, held rows), timed as
moe.py times (CUDA-graph replays, two prepared weight copies alternating, median); the rule's pick is marked, and the
best pair printed beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json

import torch
from decode_linear import device_facts, random_weight, reuse_repacks, time_graph
from moe import SHAPES, device_weights, with_input_scale

import b12x_core as bc
from b12x_core import backends, plan, workspace
from b12x_core.backends import Overrides
from b12x_core.tensor_core import configure, geometry


def split_choices(fmt: str, k: int, most: int = 8) -> list[int]:
    """K splits of `k` with at least 2 chunks each (the kernels take any; fewer chunks a split is all reduction)."""
    chunks = -(-k // geometry.chunk_k(fmt))
    return [s for s in range(1, most + 1) if chunks // s >= 2 and (s == 1 or -(-chunks // s) * (s - 1) < chunks)]


def time_splits(cls, query, copies, x, weights, ids, rule: dict, pair: tuple[int, int]) -> float:
    """µs of one call of T = len(x) tokens with the K splits `pair` and the rest of the plan's configuration `rule`
    (held rows as it has them, their fit re-checked for these splits)."""
    t, k = ids.shape
    query = dataclasses.replace(query, overrides=Overrides(holds_rows="held" in rule))
    config = {**cls.call_config(query, t), "splits": pair}
    if "held" in rule:
        config.update(configure.moe_held(query, t * k, list(pair), configure.moe_height(query)))
    backends_alone = [p.for_tokens(t).backend for p in copies]
    for backend in backends_alone:
        backend.reserve([(1, t, config)])
        workspace.reserve_scratch(x.device, backend.scratch_bytes(t, config))
    return time_graph(lambda i: backends_alone[i].run(x, weights, ids, config=config), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen3,gptoss")
    parser.add_argument("--cases", default="MXFP4:mxfp8,NVFP4:bf16")
    parser.add_argument("--ts", default="1,2,4,8,16")
    parser.add_argument("--out", default="moe_splits.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    reuse_repacks()
    ts = [int(t) for t in args.ts.split(",")]
    rows = []
    cls = next(c for c in backends.for_op("moe") if c.name == "tensor_core_moe")
    for shape in args.shapes.split(","):
        e, k, h, inter = SHAPES[shape]
        for case in args.cases.split(","):
            fmt, act = case.split(":")
            w13, w2 = random_weight(fmt, 2 * inter, h, (e,)), random_weight(fmt, h, inter, (e,))
            if act == "nvfp4":
                w13, w2 = with_input_scale(w13, w2, e)
            probe = bc.prepare_moe(w13, w2, max_tokens=max(ts), top_k=k, act_format=act, device="cuda")
            query = probe.plan.query
            copies = [plan.build(query, device_weights(probe, w13, w2), only=cls) for _ in range(2)]
            s13s, s2s = split_choices(fmt, h), split_choices(fmt, inter)
            for t in ts:
                weights_t, ids = bc.route_topk(torch.randn(t, e, device="cuda"), k)
                x = torch.randn(t, h, dtype=torch.bfloat16, device="cuda")
                rule = copies[0].for_tokens(t).config
                times = {pair: time_splits(cls, query, copies, x, weights_t, ids, rule, pair)
                         for pair in itertools.product(s13s, s2s)}  # fmt: skip
                for pair, us in times.items():
                    rows.append(dict(shape=shape, format=fmt, act=act, t=t, splits=list(pair), us=us,
                                     rule=list(rule["splits"]), held="held" in rule))  # fmt: skip
                best = min(times, key=times.get)
                mine = times.get(tuple(rule["splits"]))
                every = "  ".join(f"{a}/{b}:{u:.1f}" for (a, b), u in sorted(times.items()))
                print(f"{shape:<7} {fmt:>6} × {act:<6} T={t:<3} rule {rule['splits']} {mine:7.1f} µs   best {best} "
                      f"{times[best]:7.1f} µs   {every}", flush=True)  # fmt: skip
            with open(args.out, "w") as f:
                json.dump({**device_facts(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
