"""Prefill (large-M) linear on the GPU: the Triton tiles beside cuBLAS bf16 F.linear and fp8 torch._scaled_mm.

    python benchmarks/prefill_linear.py --out prefill.json --png prefill.png

1. M=4096 on 8192×8192 and 28672×8192: every format × activation mode, TFLOP/s and % of bf16 F.linear (and of
   per-tensor fp8 _scaled_mm for the W8A8 modes), all measured in this run.
2. The dispatched time over M ∈ {1 .. 8192} on 8192×8192 against bf16 F.linear (plotted). Each backend alone
   and the measured table the plan picks from: benchmarks/plan_check.py.
Timing as benchmarks/decode_linear.py: CUDA graphs over weight copies larger than L2, median of ≥100 replays.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from decode_linear import copies_for, random_weight, time_graph

import b12x_core as bc
import b12x_formats as bf

BF16_FORMATS = ["FP8", "FP8_BLOCK", "MXFP8", "NVFP4", "MXFP4", "Q8_0", "IQ2_XXS", "IQ2_XS"]
QUANTIZED = [("FP8", "fp8", True), ("FP8", "fp8", False), ("FP8_BLOCK", "fp8", False), ("MXFP8", "mxfp8", False),
             ("NVFP4", "nvfp4", True), ("NVFP4", "mxfp8", False), ("MXFP4", "mxfp8", False)]  # fmt: skip
SWEEP_MS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192]


def weight(fmt: str, n: int, k: int, input_scale: bool) -> bf.QuantizedWeight:
    qw = random_weight(fmt, n, k)
    if input_scale:
        qw = bf.QuantizedWeight.from_tensors(fmt, {**qw.tensors, "input_scale": np.float32(0.02)})
    return qw


def prepared(qw, activation: str, max_tokens: int, copies: int) -> list:
    return [bc.prepare_linear(qw, device="cuda", max_tokens=max_tokens, activation=activation) for _ in range(copies)]


def time_linear(preps, x) -> float:
    return time_graph(lambda i: bc.linear(x, preps[i]), len(preps))


def baselines(n: int, k: int, m: int) -> tuple[float, float]:
    copies = min(copies_for(2 * n * k), 4)
    w = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
    w8 = [t.to(torch.float8_e4m3fn) for t in w]
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    x8 = torch.randn(max(16, m), k, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    t_bf16 = time_graph(lambda i: F.linear(x, w[i]), copies)
    t_fp8 = time_graph(lambda i: torch._scaled_mm(x8, w8[i].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                       copies)  # fmt: skip
    return t_bf16, t_fp8


def large_m(rows: list, shapes: list[tuple[int, int]], m: int) -> None:
    print(f"\n## M={m}: TFLOP/s, % of bf16 F.linear, % of fp8 _scaled_mm")
    for n, k in shapes:
        t_bf16, t_fp8 = baselines(n, k, m)
        flops = 2 * m * n * k
        print(f"{n}x{k}: bf16 F.linear {t_bf16:.0f} µs {flops / t_bf16 / 1e6:.0f} TFLOP/s; "
              f"fp8 _scaled_mm {t_fp8:.0f} µs {flops / t_fp8 / 1e6:.0f} TFLOP/s")  # fmt: skip
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        for fmt, act, scale in [(f, "bf16", False) for f in BF16_FORMATS] + QUANTIZED:
            preps = prepared(weight(fmt, n, k, scale), act, m, 2)
            t = time_linear(preps, x)
            label = f"{fmt} × {act}" + (" static" if scale and act == "fp8" else "")
            row = dict(part="large_m", shape=f"{n}x{k}", m=m, format=label, us=t, tflops=flops / t / 1e6,
                       pct_bf16=100 * t_bf16 / t, pct_fp8=100 * t_fp8 / t)  # fmt: skip
            rows.append(row)
            print(f"  {label:<24} {t:>8.0f} µs {row['tflops']:>6.0f} TFLOP/s {row['pct_bf16']:>5.0f}% bf16 "
                  f"{row['pct_fp8']:>5.0f}% fp8", flush=True)  # fmt: skip


def sweep(rows: list, n: int, k: int) -> None:
    print(f"\n## {n}x{k}: dispatched time over M (µs), bf16 F.linear beside")
    bf16_w = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies_for(2 * n * k))]
    for fmt in BF16_FORMATS:
        qw = weight(fmt, n, k, False)
        preps = prepared(qw, "bf16", max(SWEEP_MS), copies_for(qw.nbytes))
        for m in SWEEP_MS:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            t = time_linear(preps, x)
            t_bf16 = time_graph(lambda i: F.linear(x, bf16_w[i]), len(bf16_w))
            rows.append(dict(part="sweep", shape=f"{n}x{k}", m=m, format=fmt, us=t, bf16_us=t_bf16))
            print(f"  {fmt:<8} M={m:<5} {t:>9.1f} µs  bf16 {t_bf16:>9.1f} µs  {t_bf16 / t:>5.2f}x", flush=True)


TILE_MS = [8, 16, 32, 64, 128, 256]
TILE_CONFIGS = [dict(BLOCK_N=n, num_warps=w, num_stages=st) for n in (32, 64, 128) for w in (4, 8) for st in (3, 4)]


def tile_configs(rows: list, n: int, k: int) -> None:
    """The tiles alone (bf16 activations) under each configuration, to retune the Triton tiles backend's
    tile_config."""
    from b12x_core.backends.triton_tiles import tile_config

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    from b12x_core.weights import stack
    from b12x_kernels import tiles

    print(f"\n## {n}x{k}: Triton tiles per configuration (µs)")
    for fmt in BF16_FORMATS:
        tw = stack([weight(fmt, n, k, False)], "bf16", None, "cuda")
        for m in TILE_MS:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            timed = {}
            for cfg in TILE_CONFIGS:
                merged = {**tile_config(m, n, sms), **cfg}

                def run(i, merged=merged):
                    return tiles.linear_tiles(fmt, x, tw.weight, tw.scales, tw.col_scale, y, grid_table=tw.grid,
                                              sign_table=tw.signs, config=merged)  # fmt: skip

                try:
                    timed[tuple(cfg.values())] = time_graph(run, 1, replays=30)
                except Exception as err:  # a configuration the GPU cannot hold (shared memory)
                    print(f"  {fmt} M={m} {cfg}: {type(err).__name__}")
            best = min(timed, key=timed.get)
            d = tile_config(m, n, sms)
            default = (d["BLOCK_N"], d["num_warps"], d["num_stages"])
            rows.append(dict(part="tile_configs", format=fmt, m=m, times={str(c): t for c, t in timed.items()}))
            print(f"  {fmt:<8} M={m:<4} best (BLOCK_N, warps, stages)={best}: {timed[best]:.1f} µs; default "
                  f"{default}: {timed.get(default, float('nan')):.1f} µs", flush=True)  # fmt: skip


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for fmt in BF16_FORMATS:
        pts = [(r["m"], r["bf16_us"] / r["us"]) for r in rows if r["part"] == "sweep" and r["format"] == fmt]
        ax.plot(*zip(*pts, strict=True), marker="o", label=fmt)
    ax.axhline(1.0, color="k", lw=1, ls="--", label="bf16 F.linear")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("speed-up over bf16 F.linear")
    ax.set_title(f"b12x linear, dispatched path, {rows[0]['shape']} — {torch.cuda.get_device_name()}")
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="prefill_linear.json")
    parser.add_argument("--png", default="prefill_linear.png")
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--tile-configs", action="store_true", help="only time the tiles per configuration")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows: list = []
    if args.tile_configs:
        tile_configs(rows, 8192, 8192)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
        return
    large_m(rows, [(8192, 8192), (28672, 8192)], args.m)
    if not args.skip_sweep:
        sweep(rows, 8192, 8192)
    result = {"device": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if not args.skip_sweep:
        plot(rows, args.png)


if __name__ == "__main__":
    main()
