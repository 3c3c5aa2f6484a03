"""The Hopper form of the tensor-core GEMM (b12x_core.tensor_core.wgmma; csrc/wgmma_gemm.cu) against the mma.sync
tensor-core GEMM over the same repacked weights and bf16 F.linear, per Llama-3.1-8B decoder layer (qkv 6144×4096,
o 4096×4096, gate_up 28672×4096, down 4096×14336), NVFP4 and FP8, M from 1 to 4096. Needs an sm_90 GPU.

    python benchmarks/wgmma_linear.py --out wgmma.json [--png wgmma.png] [--ms 16,32,...] [--formats NVFP4,FP8]
    python benchmarks/wgmma_linear.py --from-json wgmma.json --png wgmma.png      # the plot of a saved run

Method (mma_linear.py's, decode_linear.py's helpers): one CUDA graph runs the layer on each of several weight
copies (together more than 4× L2, so weights come from HBM), replayed between CUDA events; per-layer time = median
replay time / copies. Weights are random valid codes written straight into the kernels' layout (mma_linear's
random_shard, with the decode's power-of-two range set so values are ordinary). The wgmma kernel is timed at every
token tile mt that suits M (8·mt tokens per CTA, all four linears alike, each linear at the K split that fills the GPU
for that tile: wgmma.default_config's rule) and the best is reported, with its staging launch; with --wide, from 32
tokens on, so are its 256-row CTAs (tiles 16, wgmma.wide_config; rows "wgmma_wide"); the mma.sync kernel at
the tensor-core backend's default configuration (configure.default_config: token tile and K split). Before timing, each
(format, M) checks the wgmma output against the mma.sync one on the first copy (`check`: max |Δ| / max |y|).
FP8_BLOCK and the IQ2 codecs run in the wgmma kernel with a per-chunk fp32 factor folded from partial sums (token
tiles up to 64): `--formats IQ2_XS,FP8_BLOCK` times them the same way.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from decode_linear import copies_for, copy_bandwidth, device_facts, time_graph
from mma_linear import random_shard, shard_bytes

from b12x_core.tensor_core import configure, gemm, geometry, wgmma

LLAMA8B = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
FORMATS = "NVFP4,FP8"
MS = "1,16,32,64,128,256,512,1024,4096"
# layout.decode_range for random_shard's scales (NVFP4: E4M3 ≤ 1.875; MXFP8 / MXFP4: E8M0 ≤ 2^8;
# Q8_0 decodes exactly)
SCALE_MUL = {"FP8": 2.0**120, "FP8_BLOCK": 2.0**120, "MXFP8": 2.0**110, "MXFP4": 2.0**115, "NVFP4": 2.0**123,
             "Q8_0": 1.0, "IQ2_XS": 1.0, "IQ2_XXS": 1.0}  # fmt: skip
# the decodes' bf16 patterns' bias
BIT_PATTERN_BIAS = {"FP8": 2.0**120, "FP8_BLOCK": 2.0**120, "MXFP8": 2.0**120, "MXFP4": 2.0**126, "NVFP4": 2.0**126}


def shard(fmt: str, n: int, k: int) -> gemm.MmaShard:
    s = random_shard(fmt, n, k)
    s.scale_mul = SCALE_MUL[fmt]
    s.alpha = 0.01 / s.scale_mul * BIT_PATTERN_BIAS.get(fmt, 100.0)  # results of ordinary size
    return s


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max |y - ref| / max |ref|; inf where y holds a NaN (an output never written, or wrong)."""
    err = ((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()
    return err if err == err else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default=FORMATS)
    parser.add_argument("--ms", default=MS)
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--wide", action="store_true", help="also time the 256-row CTAs (tiles 16; FP4, from 32 "
                        "tokens; rows 'wgmma_wide')")  # fmt: skip
    parser.add_argument("--out", default="wgmma_linear.json")
    parser.add_argument("--png", default=None)
    parser.add_argument("--from-json", default=None, help="plot a saved run (no GPU)")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        plot(saved["rows"], saved["device"], args.png or args.from_json.replace(".json", ".png"))
        return
    started = time.time()
    if torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit(f"wgmma_gemm runs on sm_90 only, this is {torch.cuda.get_device_name()}")
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()
    ms = [int(m) for m in args.ms.split(",")]
    layer_params = sum(n * k for _, n, k in LLAMA8B)
    name = torch.cuda.get_device_name()
    print(f"# {name}: copy {bw:.0f} GB/s, {sms} SMs; Llama-3.1-8B layer, {layer_params / 1e6:.0f} M weights")
    rows = []

    bf16 = [[torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _, n, k in LLAMA8B]
            for _ in range(copies_for(2 * layer_params))]  # fmt: skip
    base = {}
    for m in ms:
        xs = {k: torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for k in (4096, 14336)}
        t = time_graph(lambda i: [F.linear(xs[w.shape[1]], w) for w in bf16[i]], len(bf16), args.replays)
        base[m] = t
        rows.append(dict(m=m, format="bf16", kernel="F.linear", config="", us=t, gbs=2 * layer_params / t / 1e3))
    bf16 = None
    torch.cuda.empty_cache()

    for fmt in args.formats.split(","):
        one_layer = [shard(fmt, n, k) for _, n, k in LLAMA8B]
        nbytes = sum(shard_bytes(s) for s in one_layer)
        layers = [one_layer] + [[shard(fmt, n, k) for _, n, k in LLAMA8B] for _ in range(copies_for(nbytes) - 1)]
        for m in ms:
            xs = {k: torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for k in (4096, 14336)}
            ys = {n: torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _, n, _ in LLAMA8B}
            concurrent_ctas = geometry.concurrent_ctas_here(fmt, configure.token_tile(m), "cuda")
            share = {k: configure.split_share(fmt, m, k) for k in xs}  # a K split's partials' cost (the plans' rule)
            configs = [configure.default_config(m, s.n, s.chunks, concurrent_ctas, sms=sms, share=share[s.k], fmt=fmt)
                       for s in one_layer]  # fmt: skip

            def workspaces(cs, m=m, one_layer=one_layer):
                """The scratch of one layer under configurations cs (one per linear)."""
                pairs = zip(one_layer, cs, strict=True)
                return [gemm.MmaWorkspace.create(m, s.n, c.splits, c.mt, "cuda", row_tiles=c.tiles) for s, c in pairs]

            def old_rule_time(old, chosen, layer):
                """The layer under the split rule without the partials' cost (configure.split_share's weight left out),
                this run; None where that rule picks the same splits as `chosen`."""
                if [c.splits for c in old] == [c.splits for c in chosen]:
                    return None
                old_wss = workspaces(old)
                return time_graph(lambda i: layer(i, old, old_wss), len(layers), args.replays)

            wss = workspaces(configs)

            # the stream is read per call: time_graph captures on a stream of its own
            def mma_layer(i, configs=configs, wss=wss, xs=xs, ys=ys):
                stream = torch.cuda.current_stream().cuda_stream
                for s, c, ws in zip(layers[i], configs, wss, strict=True):
                    gemm.run(xs[s.k], [s], ys[s.n], None, c, ws, stream)

            kernel_tiles = wgmma.token_tiles_of(fmt)  # the formats with a per-chunk factor: up to 64 tokens
            tiles = [mt for mt in kernel_tiles if 8 * mt <= max(8, 2 * m) and 16 * mt >= min(m, 128)]
            tiles = tiles or [kernel_tiles[-1]]
            wgmma_ctas = {mt: wgmma.concurrent_ctas(fmt, mt, sms, True) for mt in kernel_tiles}
            wconfigs = {mt: [wgmma.default_config(m, s.n, s.chunks, wgmma_ctas.get, mt, share[s.k]) for s in one_layer]
                        for mt in tiles}  # fmt: skip
            wwss = {mt: workspaces(cs) for mt, cs in wconfigs.items()}
            staged = torch.empty(max(wgmma.staged_bytes(fmt, m, k) for k in xs), dtype=torch.uint8, device="cuda")

            def wgmma_layer(i, configs_, wss_, xs=xs, ys=ys, staged=staged):
                """Copy i of the layer through a wgmma form under per-linear configs and workspaces."""
                stream = torch.cuda.current_stream().cuda_stream
                for s, c, ws in zip(layers[i], configs_, wss_, strict=True):
                    wgmma.run(xs[s.k], [s], ys[s.n], None, c, ws, staged, stream)

            def check_against_mma(tile_configs, tile_wss, xs=xs, configs=configs, wss=wss, staged=staged):
                """max |Δ| / max |y| of a wgmma form's configurations against mma.sync on the same bytes (first copy),
                before any timing; inf where an output is NaN (never written, or wrong)."""
                worst, stream = 0.0, torch.cuda.current_stream().cuda_stream
                for j, (s, c, ws) in enumerate(zip(one_layer, configs, wss, strict=True)):
                    ref = torch.empty(m, s.n, dtype=torch.bfloat16, device="cuda")
                    gemm.run(xs[s.k], [s], ref, None, c, ws, stream)
                    for mt in tile_configs:
                        y = torch.full_like(ref, float("nan"))
                        wgmma.run(xs[s.k], [s], y, None, tile_configs[mt][j], tile_wss[mt][j], staged, stream)
                        worst = max(worst, relative_error(y, ref))
                return worst

            check = check_against_mma(wconfigs, wwss)
            # the 256-row form (tiles 16): its token tiles up to twice M, one CTA an SM
            wide_form = args.wide and m >= 32 and fmt in wgmma.WIDE_FORMATS
            wide_tiles = [mt for mt in wgmma.WIDE_TOKEN_TILES if 8 * mt <= max(64, 2 * m)] if wide_form else []
            wide_configs = {mt: [wgmma.wide_config(m, s.n, s.chunks, sms, mt, share[s.k]) for s in one_layer]
                            for mt in wide_tiles}  # fmt: skip
            wide_wss = {mt: workspaces(cs) for mt, cs in wide_configs.items()}
            wide_check = check_against_mma(wide_configs, wide_wss)
            t_mma = time_graph(mma_layer, len(layers), args.replays)
            label = " ".join(f"{c.mt}/{c.splits}" for c in configs)
            mma_unweighted = [configure.default_config(m, s.n, s.chunks, concurrent_ctas, sms=sms) for s in one_layer]
            t_mma_unweighted = old_rule_time(mma_unweighted, configs, mma_layer)
            rows.append(dict(m=m, format=fmt, kernel="mma", config=label, us=t_mma, gbs=nbytes / t_mma / 1e3,
                             unweighted_split_us=t_mma_unweighted,
                             unweighted_splits=[c.splits for c in mma_unweighted]))  # fmt: skip
            if t_mma_unweighted:
                print(
                    f"M={m:<4} {fmt:<6} mma {t_mma:8.1f} µs [{label}], unweighted splits "
                    f"{' '.join(str(c.splits) for c in mma_unweighted)}: {t_mma_unweighted:8.1f} µs",
                    flush=True,
                )
            per_nt = {}
            for mt in tiles:
                per_nt[mt] = time_graph(lambda i, mt=mt: wgmma_layer(i, wconfigs[mt], wwss[mt]), len(layers),
                                        args.replays)  # fmt: skip
            best = min(per_nt, key=per_nt.get)
            t_w = per_nt[best]
            wlabel = f"mt={best} " + " ".join(str(c.splits) for c in wconfigs[best])
            # the best tile under the old split rule
            unweighted = [wgmma.default_config(m, s.n, s.chunks, wgmma_ctas.get, best) for s in one_layer]
            t_unweighted = old_rule_time(unweighted, wconfigs[best], wgmma_layer)
            rows.append(dict(m=m, format=fmt, kernel="wgmma", config=wlabel, us=t_w, gbs=nbytes / t_w / 1e3,
                             per_nt_us=per_nt, check=check, unweighted_split_us=t_unweighted,
                             unweighted_splits=[c.splits for c in unweighted]))  # fmt: skip
            print(f"M={m:<4} {fmt:<6} bf16 {base[m]:8.1f} µs | mma {t_mma:8.1f} µs [{label}] | wgmma {t_w:8.1f} µs "
                  f"[{wlabel}] {t_mma / t_w:5.2f}x mma {base[m] / t_w:5.2f}x bf16 | "
                  + " ".join(f"mt{mt}:{v:.0f}" for mt, v in per_nt.items())
                  + f" | check {check:.1e}"
                  + (f" | unweighted splits {t_unweighted:.0f}" if t_unweighted else ""), flush=True)  # fmt: skip
            # the 256-row form at its best token tile against the 128-row form above
            if wide_configs:
                per = {mt: time_graph(lambda i, cs=cs, ws=wide_wss[mt]: wgmma_layer(i, cs, ws), len(layers),
                                      args.replays)
                       for mt, cs in wide_configs.items()}  # fmt: skip
                best_mt = min(per, key=per.get)
                t_wide = per[best_mt]
                wide_label = f"mt={best_mt} " + " ".join(str(c.splits) for c in wide_configs[best_mt])
                rows.append(dict(m=m, format=fmt, kernel="wgmma_wide", config=wide_label, us=t_wide,
                                 gbs=nbytes / t_wide / 1e3, per_nt_us=per, check=wide_check))  # fmt: skip
                print(f"M={m:<4} {fmt:<6} wgmma_wide {t_wide:8.1f} µs [{wide_label}] {t_w / t_wide:5.2f}x wgmma "
                      f"{base[m] / t_wide:5.2f}x bf16 | " + " ".join(f"mt{mt}:{v:.0f}" for mt, v in per.items())
                      + f" | check {wide_check:.1e}", flush=True)  # fmt: skip
        layers = one_layer = None
        torch.cuda.empty_cache()

    print(f"\n{'M':>5} {'format':<7} {'bf16 µs':>9} {'mma µs':>9} {'wgmma µs':>9} {'best':>14} {'wgmma/mma':>10} "
          f"{'check':>8}")  # fmt: skip
    for r in rows:
        if r["kernel"] != "wgmma":
            continue
        mma = next(x for x in rows if x["m"] == r["m"] and x["format"] == r["format"] and x["kernel"] == "mma")
        print(f"{r['m']:>5} {r['format']:<7} {base[r['m']]:9.1f} {mma['us']:9.1f} {r['us']:9.1f} {r['config']:>14} "
              f"{mma['us'] / r['us']:10.2f} {r['check']:8.1e}")  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({**device_facts(), "copy_gbs": bw, "sms": sms, "rows": rows, "seconds": time.time() - started}, f,
                  indent=1)  # fmt: skip
    print(f"# {time.time() - started:.0f} s; wrote {args.out}")
    if args.png:
        plot(rows, name, args.png)


def plot(rows: list, device: str, path: str) -> None:
    """Speed-up over bf16 F.linear against M, per format: the mma.sync kernel and the wgmma kernel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = {r["m"]: r["us"] for r in rows if r["kernel"] == "F.linear"}
    fig, ax = plt.subplots(figsize=(7, 4))
    for fmt in dict.fromkeys(r["format"] for r in rows if r["kernel"] != "F.linear"):
        for kernel, style in (("mma", "--"), ("wgmma", "-"), ("wgmma_wide", "-.")):
            pts = sorted((r["m"], base[r["m"]] / r["us"]) for r in rows if r["format"] == fmt and r["kernel"] == kernel)
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="o", label=f"{fmt} {kernel}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens M")
    ax.set_ylabel("× bf16 F.linear (Llama-3.1-8B layer)")
    ax.set_title(f"wgmma vs mma.sync, {device}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
