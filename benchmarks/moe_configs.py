"""Where the fused MoE's time goes, and which tile configuration each grouped GEMM wants (needs a CUDA GPU):

    python benchmarks/moe_configs.py --out moe_configs.json [--shapes qwen3,dsv3] [--formats MXFP4] [--ts 1,64,4096]

For each shape × format (bf16 activations) × T: a torch.profiler breakdown of one dispatched call (µs of each
kernel per call), then each grouped GEMM (gate/up with SiLU fused; down) timed alone over block_m × block_n ×
warps × stages: CUDA-graph replays, median of 100, two prepared weight copies alternating (moe.py's method).
The printout ends with the best configuration per stage; b12x_core.backends.triton_moe.tile_config is written
from it.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
from decode_linear import random_weight, time_graph
from moe import SHAPES

import b12x_core as bc
from b12x_core.moe_blocks import block_table


def profile_call(fn, calls: int = 5) -> list[tuple[str, float]]:
    """(kernel name, device µs per call), largest first."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", 0) or getattr(event, "cuda_time_total", 0)
        if us > 0:
            rows.append((event.key[:70], us / calls))
    return sorted(rows, key=lambda r: -r[1])


def block_ms(tokens: int, top_k: int, experts: int) -> list[int]:
    per_expert = tokens * top_k / experts
    return [16] if per_expert <= 8 else [16, 32, 64] if per_expert <= 64 else [64, 128]


def sweep_stage(stage: str, fmt: str, preps, x, ids, top_k: int) -> list[dict]:
    from b12x_kernels import tiles

    p0 = preps[0]
    t = x.shape[0]
    rows = []
    inter = torch.randn(t * top_k, p0.intermediate, dtype=torch.bfloat16, device="cuda")
    for bm in block_ms(t, top_k, p0.experts):
        order, blocks = block_table(ids, p0.experts, bm)
        table = (order, *blocks)
        for bn, warps, stages in itertools.product((32, 64, 128), (4, 8), (2, 3, 4)):
            if (warps == 8 or bn == 128) if bm < 64 else bn == 32:  # small tiles for decode, large for prefill
                continue
            cfg = dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)

            def call(i, cfg=cfg, table=table):
                p = preps[i]
                if stage == "w13":
                    tw, a = p.plan.rows[0].backend.w13, x
                    out = torch.empty(t * top_k, p.intermediate, dtype=torch.bfloat16, device="cuda")
                    kw = dict(rows_per_expert=tw.weight.shape[0] // p.experts, gather=True, act="silu")
                else:
                    tw, a = p.plan.rows[0].backend.w2, inter
                    out = torch.empty(t * top_k, p.hidden, dtype=torch.float32, device="cuda")
                    kw = dict(rows_per_expert=p.hidden, gather=False, act="none")
                tiles.moe_tiles(fmt, a, *table, tw.weight, tw.scales, tw.col_scale, out, top_k=top_k,
                                grid_table=tw.grid, sign_table=tw.signs, k_split=a.shape[1], **kw, **cfg)  # fmt: skip

            try:
                us = time_graph(call, len(preps))
            except Exception as err:  # shared memory or registers exceeded: not a candidate
                print(f"    {stage} {cfg}: {type(err).__name__}: {str(err)[:120]}")
                continue
            rows.append(dict(stage=stage, us=us, **cfg))
    return sorted(rows, key=lambda r: r["us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen3,dsv3")
    parser.add_argument("--formats", default="MXFP4")
    parser.add_argument("--ts", default="1,64,4096")
    parser.add_argument("--out", default="moe_configs.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    results = []
    for shape in args.shapes.split(","):
        e, k, h, inter = SHAPES[shape]
        for fmt in args.formats.split(","):
            w13, w2 = random_weight(fmt, 2 * inter, h, (e,)), random_weight(fmt, h, inter, (e,))
            for t in (int(v) for v in args.ts.split(",")):
                preps = [bc.prepare_moe(w13, w2, max_tokens=t, top_k=k, device="cuda") for _ in range(2)]
                x = torch.randn(t, h, dtype=torch.bfloat16, device="cuda")
                weights, ids = bc.route_topk(torch.randn(t, e, device="cuda"), k)
                total = time_graph(lambda i: bc.moe(x, weights, ids, preps[i]), 2)
                kernels = profile_call(lambda: bc.moe(x, weights, ids, preps[0]))
                print(f"## {shape} {fmt} T={t}: {total:.1f} µs per call (graph)", flush=True)
                for name, us in kernels[:12]:
                    print(f"    {us:8.1f} µs  {name}")
                best = {}
                for stage in ("w13", "w2"):
                    ranked = sweep_stage(stage, fmt, preps, x, ids, k)
                    best[stage] = ranked[:3]
                    for r in ranked[:3]:
                        print(f"  {stage} {r['us']:8.1f} µs  {r}", flush=True)
                results.append(dict(shape=shape, format=fmt, t=t, us=total, kernels=kernels, best=best))
                with open(args.out, "w") as f:
                    json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
