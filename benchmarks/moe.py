"""Fused MoE on the GPU: b12x (bc.moe, dispatched) beside a bf16 reference MoE (per-expert F.linear on bf16
weights), every MoE format × its activation formats.

    python benchmarks/moe.py --out moe.json --png moe.png [--shapes qwen3,gptoss,dsv3] [--ts 1,2,4,8,16,64,512,4096]
        [--cases MXFP4:bf16,NVFP4:nvfp4,...]

Shapes: qwen3 = Qwen3-30B-A3B-like (E=128, top-8, H=2048, I=768), gptoss = gpt-oss-120b-like (E=128, top-4,
H=2880, I=2880), dsv3 = DeepSeek-V3-like (E=256, top-8, H=7168, I=2048). Routing: random logits, renormalised
top-k. Both are timed as CUDA-graph replays (median of 100): b12x with two prepared copies alternating, so for
the small shapes the weights are not all L2-resident; the bf16 reference loops over the touched experts, its
token lists read from the routing before capture. At T=1 the bandwidth floor counts the bytes of the touched experts'
weights (FORMATS.md) against the device copy bandwidth measured in the same run; at large T, TFLOP/s counts
the useful FLOPs, 2·T·k·(2I·H + H·I), against cuBLAS bf16 on a [4096, H] × [2I, H] GEMM measured in the same run.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from decode_linear import copy_bandwidth, random_weight, time_graph

import b12x_core as bc
import b12x_formats as bf
from b12x_core.moe import MOE_FORMATS

SHAPES = {"qwen3": (128, 8, 2048, 768), "gptoss": (128, 4, 2880, 2880), "dsv3": (256, 8, 7168, 2048)}


def expert_groups(ids) -> list:
    """(expert, token rows, slot columns) of each touched expert: the routing, read once outside the timing."""
    return [(e, *(ids == e).nonzero(as_tuple=True)) for e in torch.unique(ids).tolist()]


def bf16_moe(x, weights, groups, w13, w2, inter):
    """Per touched expert: gate/up F.linear, SiLU·up, down F.linear, weighted scatter-add (graph-capturable)."""
    y = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e, tokens, slots in groups:
        h = F.linear(x[tokens], w13[e])
        a = F.silu(h[:, :inter]) * h[:, inter:]
        y.index_add_(0, tokens, F.linear(a, w2[e]).float() * weights[tokens, slots, None])
    return y.to(torch.bfloat16)


def expert_bytes(p, touched: int) -> int:
    backend = p.plan.rows[0].backend  # the Triton MoE backend: experts stacked by rows
    t13, t2 = backend.w13, backend.w2
    per_expert = sum(t.weight.numel() * t.weight.element_size() + (0 if t.scales is None else t.scales.numel() *
                     t.scales.element_size()) for t in (t13, t2)) // p.experts  # fmt: skip
    return per_expert * touched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen3,gptoss,dsv3")
    parser.add_argument("--ts", default="1,2,4,8,16,64,512,4096")
    parser.add_argument("--cases", default=",".join(f"{f}:{a}" for f, acts in MOE_FORMATS.items() for a in acts),
                        help="format:activation pairs")  # fmt: skip
    parser.add_argument("--out", default="moe.json")
    parser.add_argument("--png", default="moe.png")
    args = parser.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    ts = [int(t) for t in args.ts.split(",")]
    rows = []
    print(f"# {torch.cuda.get_device_name()}: copy bandwidth {bw:.0f} GB/s")
    for shape in args.shapes.split(","):
        e, k, h, inter = SHAPES[shape]
        w13_bf16 = torch.randn(e, 2 * inter, h, dtype=torch.bfloat16, device="cuda") / h**0.5
        w2_bf16 = torch.randn(e, h, inter, dtype=torch.bfloat16, device="cuda") / inter**0.5
        a = torch.randn(4096, h, dtype=torch.bfloat16, device="cuda")
        dense_flops = 2 * 4096 * h * 2 * inter
        t_dense = time_graph(lambda i: F.linear(a, w13_bf16[i]), 2)  # cuBLAS bf16 rate on this shape
        dense_tflops = dense_flops / t_dense / 1e6
        print(f"## {shape}: E={e} top-{k} H={h} I={inter}; cuBLAS bf16 {dense_tflops:.0f} TFLOP/s")
        cases = [case.split(":") for case in args.cases.split(",")]
        for fmt in dict.fromkeys(f for f, _ in cases):
            w13 = random_weight(fmt, 2 * inter, h, (e,))
            w2 = random_weight(fmt, h, inter, (e,))
            for act in (a for f, a in cases if f == fmt):
                if act == "nvfp4":  # the checkpoint's per-expert activation scale
                    scale = {"input_scale": np.full(e, 0.01, np.float32)}
                    w13, w2 = (bf.QuantizedWeight.from_tensors(fmt, {**w.tensors, **scale}) for w in (w13, w2))
                try:
                    preps = [bc.prepare_moe(w13, w2, max_tokens=max(ts), top_k=k, act_format=act, device="cuda")
                             for _ in range(2)]  # fmt: skip
                except bc.UnsupportedError as err:
                    print(f"  {fmt} × {act}: {err}")
                    continue
                for t in ts:
                    x = torch.randn(t, h, dtype=torch.bfloat16, device="cuda")
                    weights, ids = bc.route_topk(torch.randn(t, e, device="cuda"), k)
                    us = time_graph(lambda i: bc.moe(x, weights, ids, preps[i]), 2)
                    groups = expert_groups(ids)
                    ref_us = time_graph(lambda i: bf16_moe(x, weights, groups, w13_bf16, w2_bf16, inter), 1)
                    touched = int(torch.unique(ids).numel())
                    nbytes = expert_bytes(preps[0], touched)
                    flops = 2 * t * k * (2 * inter * h + h * inter)
                    row = dict(shape=shape, format=fmt, act=act, t=t, us=us, bf16_ref_us=ref_us, touched=touched,
                               gbs=nbytes / us / 1e3, pct_copy=100 * nbytes / us / 1e3 / bw,
                               tflops=flops / us / 1e6, pct_cublas=100 * flops / us / 1e6 / dense_tflops)  # fmt: skip
                    rows.append(row)
                    print(f"  {fmt:<12} × {act:<6} T={t:<5} {us:>9.1f} µs  bf16 ref {ref_us:>9.1f} µs  "
                          f"{row['pct_copy']:>5.1f}% copy  {row['pct_cublas']:>5.1f}% cuBLAS", flush=True)  # fmt: skip
                save(args.out, bw, rows)  # after each format: a run cut short keeps what it measured
    save(args.out, bw, rows)
    plot(rows, args.png)


def save(path: str, bw: float, rows: list) -> None:
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_gbs": bw, "rows": rows}, f, indent=1)


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({r["shape"] for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        for fmt, act in sorted({(r["format"], r["act"]) for r in rows if r["shape"] == shape}):
            pts = [(r["t"], r["us"]) for r in rows if (r["shape"], r["format"], r["act"]) == (shape, fmt, act)]
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"{fmt} × {act}")
        ref = sorted(
            {(r["t"], r["bf16_ref_us"]) for r in rows if r["shape"] == shape and r["format"] == rows[0]["format"]}
        )
        ax.plot(*zip(*ref, strict=True), "k--", label="bf16 reference MoE")
        ax.set(xscale="log", yscale="log", xlabel="tokens T", ylabel="µs", title=shape)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
