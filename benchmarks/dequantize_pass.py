"""The dequantize-to-bf16 pass of dequantize + cuBLAS (b12x_kernels.mma_dequant.dequantize_mma: the tensor-core layout
to a bf16 [N, K] workspace), per Llama-3.1-8B decoder layer, at several program shapes (rows, chunks, warps a Triton
program) and as the CUDA pass (program "cuda": b12x_kernels.mma_dequantize, every format), against the copy
bandwidth measured in the same run. Needs a CUDA GPU.

    python benchmarks/dequantize_pass.py --out dequantize_pass.json [--formats NVFP4,FP8] [--programs 16x1x4,64x2x8]
    ncu -k regex:_dequantize_mma python benchmarks/dequantize_pass.py --formats NVFP4 --programs 32x2x4 --once
    python benchmarks/dequantize_pass.py --from-json "before=old.json,after=new.json" --png dequantize_pass.png # no GPU

Why it matters: at large M the plan runs dequantize + cuBLAS, whose time is the bf16 GEMM's plus this pass, so the
pass's distance from its floor (weight bytes read + bf16 bytes written, at copy bandwidth) is what the dequantization
path loses to bf16 F.linear. Method as decode_linear.py: one CUDA graph dequantizes every linear of the layer from each
of several weight copies (more than 4× L2) into one workspace per shape, replayed between CUDA events; per-layer time =
median replay / copies.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from decode_linear import copies_for, copy_bandwidth, time_graph
from mma_linear import random_shard, shard_bytes

import b12x_kernels
from b12x_core.tensor_core import gemm, geometry, layout
from b12x_core.weights import grid_table, sign_table
from b12x_kernels import mma_dequant

LLAMA8B = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
FORMATS = "NVFP4,MXFP4,FP8,MXFP8,Q8_0,IQ2_XS,IQ2_XXS"
PROGRAMS = "16x1x4,16x2x4,16x4x4,32x1x4,32x2x4,32x2x8,64x1x4,64x1x8,64x2x8,128x1x8"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default=FORMATS)
    parser.add_argument("--programs", default=PROGRAMS, help="rows x chunks x warps, comma-separated; 'cuda': the "
                        "CUDA pass (b12x_kernels.mma_dequantize)")  # fmt: skip
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--out", default="dequantize_pass.json")
    parser.add_argument("--once", action="store_true", help="dequantize one layer once per program, untimed (for ncu)")
    parser.add_argument("--from-json", default="", help="LABEL=run.json,... saved runs to plot (no GPU)")
    parser.add_argument("--png", default="", help="with --from-json: each format's % of copy, per run")
    args = parser.parse_args()
    if args.from_json:
        plot([part.split("=", 1) for part in args.from_json.split(",")], args.png or "dequantize_pass.png")
        return
    started = time.time()
    bw = copy_bandwidth()
    programs = [p if p == "cuda" else tuple(int(v) for v in p.split("x")) for p in args.programs.split(",")]
    device = "cuda"
    fields = torch.from_numpy(np.asarray(layout.E2M1_FIELDS, dtype=np.int32).reshape(-1)).to(device)
    outs = {(n, k): torch.empty(n, k, dtype=torch.bfloat16, device=device) for _, n, k in LLAMA8B}
    factors = {n: torch.ones(n, dtype=torch.float32, device=device) for _, n, _ in LLAMA8B}
    written = sum(2 * n * k for _, n, k in LLAMA8B)
    print(f"# {torch.cuda.get_device_name()}: copy {bw:.0f} GB/s; 8B layer, bf16 written {written / 1e6:.0f} MB")
    rows = []
    for fmt in args.formats.split(","):
        one = [random_shard(fmt, n, k) for _, n, k in LLAMA8B]
        read = sum(shard_bytes(s) for s in one)
        copies = 1 if args.once else copies_for(read)
        layers = [one] + [[random_shard(fmt, n, k) for _, n, k in LLAMA8B] for _ in range(copies - 1)]
        grid, signs = grid_table(fmt, device), sign_table(fmt, device)
        floor = (read + written) / bw * 1e-3  # µs at copy bandwidth: its bytes read and written
        best = None
        for program in programs:

            def dequantize(i, program=program, layers=layers, grid=grid, signs=signs, fmt=fmt):
                for s in layers[i]:
                    out = outs[s.n, s.k]
                    if program == "cuda":  # b12x_kernels.mma_dequantize over the GEMM's argument block of the shard
                        args = s.args(gemm.MmaConfig(1, 1), out.stride(0), row_scale=factors[s.n])
                        b12x_kernels.mma_dequantize(args, out.data_ptr(), torch.cuda.current_stream().cuda_stream)
                        continue
                    mma_dequant.dequantize_mma(fmt, s.codes, s.meta, s.meta2, s.block_scale, grid, signs, fields,
                                               factors[s.n], out, geometry.chunk_k(fmt), s.chunks,
                                               program=program)  # fmt: skip

            if args.once:
                dequantize(0)
                torch.cuda.synchronize()
                continue
            us = time_graph(dequantize, len(layers), args.replays)
            name = program if program == "cuda" else "x".join(map(str, program))
            row = dict(format=fmt, program=name, us=us, floor_us=floor,
                       of_copy=floor / us, read_mb=read / 1e6, written_mb=written / 1e6)  # fmt: skip
            rows.append(row)
            best = row if best is None or us < best["us"] else best
            print(f"{fmt:8s} {row['program']:9s} {us:8.1f} µs {100 * floor / us:5.1f}% of copy (floor {floor:.1f} µs)")
        if best:
            print(f"{fmt:8s} best {best['program']}: {best['us']:.1f} µs, {100 * best['of_copy']:.1f}% of copy")
        layers = one = None
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), copy_gbs=bw, rows=rows), f, indent=1)
    print(f"# {time.time() - started:.0f} s")


def plot(runs: list[list[str]], png: str) -> None:
    """Bars: per format, each run's time at its best program, as % of the copy bandwidth measured in that run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = []
    for label, path in runs:
        with open(path) as f:
            loaded.append((label, json.load(f)))
    formats = list(dict.fromkeys(r["format"] for _, run in loaded for r in run["rows"]))
    fig, ax = plt.subplots(figsize=(1.6 * len(formats) + 2, 4))
    width = 0.8 / len(loaded)
    for i, (label, run) in enumerate(loaded):
        best = {}
        for r in run["rows"]:
            best[r["format"]] = max(best.get(r["format"], 0.0), 100 * r["of_copy"])
        xs = [j + i * width for j, f in enumerate(formats) if f in best]
        ax.bar(xs, [best[f] for f in formats if f in best], width, label=label)
    ax.set_xticks([j + width * (len(loaded) - 1) / 2 for j in range(len(formats))], formats)
    ax.set_ylabel("% of copy bandwidth (best program)")
    ax.set_ylim(0, 100)
    ax.axhline(100, color="k", lw=0.5)
    ax.set_title(f"dequantize-to-bf16 pass, Llama-3.1-8B layer, {loaded[0][1]['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
