"""The tensor-core mixed-input GEMM per decoder layer: the four linears of a Llama-3.1-70B layer (qkv 10240×8192,
o 8192×8192, gate_up 57344×8192, down 8192×28672) for every format over M, beside bf16 F.linear and fp8
torch._scaled_mm (per-tensor, pre-quantized activations, M padded to 16) in the same run.

    python benchmarks/mma_linear.py --out mma.json [--png mma.png] [--ms 1,2,...] [--formats ...] [--sweep]
        [--model 70b|8b] [--pdl-ab] [--balance-ab] [--per-linear]

--model 8b takes a Llama-3.1-8B layer's linears instead (qkv 6144×4096, o 4096×4096, gate_up 28672×4096, down
4096×14336).

Method (decode_linear.py's): one CUDA graph runs the layer on each of several weight copies (together more than
4× L2, so weights come from HBM), replayed many times between CUDA events; per-layer time = median replay
time / copies. Weights are random valid codes written straight into the kernel's layout (quantizing 855 M
weights on the host would take minutes; the kernel's time does not depend on the values). `--sweep` also times
every token tile × K split at each M and reports the best beside the default configuration (`--sweep-one-token`: at
one-token tiles also every CTA height and staged or resident activations, which set how many CTAs an SM holds).
`--pdl-ab` times
the default configuration with programmatic dependent launch and without (B12X_PDL=1 / 0's argument blocks), in the
same run: the graph runs the layer's four linears back to back, so each starts on the previous one's tail (in a model,
norms and attention sit between some of them). `--per-linear` adds each linear's own time (a graph of that linear
alone over the copies) to the default configuration's rows. `--balance-ab` also times, at one-token tiles, 128-row
CTAs (split as far as one wave allows) beside the default's configure.balanced_config heights (6-8 row tiles a CTA for
even work per SM) in the same run. `--resident-ab` also times, at one-token tiles, the default configurations with
resident activations toggled (MmaConfig.resident: the split's activations held whole, no CTA barrier a stage; the
defaults hold them where configure.holds_resident allows). `--x-quant-ab` times, at one-token tiles, each quantized
activation mode the format pairs with (FP8: fp8 static; MXFP8, MXFP4: mxfp8; NVFP4: mxfp8, nvfp4) twice: quantized by
the operand pass before each linear under the bf16 defaults, and by the kernel under the mode's own defaults (rows
held where configure.holds_resident allows the pair; MmaShard.args's x_quant).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import torch
import torch.nn.functional as F
from decode_linear import copies_for, copy_bandwidth, time_graph

import b12x_formats as bf
from b12x_core import pdl
from b12x_core.backends import operands
from b12x_core.tensor_core import configure, gemm, geometry
from b12x_core.tensor_core import layout as mma_layout
from b12x_formats.kernel_facts import format_id

LLAMA70B = [("qkv", 10240, 8192), ("o", 8192, 8192), ("gate_up", 57344, 8192), ("down", 8192, 28672)]
LLAMA8B = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
MODELS = {"70b": LLAMA70B, "8b": LLAMA8B}
FORMATS = "IQ2_XXS,IQ2_XS,NVFP4,MXFP4,Q8_0,MXFP8,FP8,FP8_BLOCK"
MS = "1,2,4,8,16,32,64,128,256,512,1024"
# --x-quant-ab: the checkpoint input_scale of each quantized activation mode, for randn activations (fp8 static:
# codes up to about ±250; nvfp4: an input_scale for |x| up to about 5). The modes a format pairs with are
# geometry.MMA.x_quant_formats'.
X_QUANT_INPUT_SCALES = {"fp8_static": 0.02, "mxfp8": None, "nvfp4": 5.0 / (448 * 6)}


def random_shard(fmt: str, n: int, k: int) -> gemm.MmaShard:
    """Random valid codes and scales in the kernel's layout (E4M3 codes without NaN, scales near 1, IQ2 d=0.01)."""
    ck = geometry.chunk_k(fmt)
    chunks, n16 = -(-k // ck), -(-n // 16)
    codes = torch.randint(0, 256, (n16 * chunks * 1024,), dtype=torch.uint8, device="cuda")
    spec = bf.spec(fmt)
    if spec.packing != "ggml" and spec.bits_per_weight >= 8:
        codes &= 0xF7  # no E4M3 NaN (0x7F / 0xFF)
    meta = meta2 = block_scale = tables = None
    rows = n16 * 16 * chunks

    def fp16_bytes(count):
        return torch.from_numpy(np.full(count, 0.01, np.float16).view(np.uint8)).to("cuda")

    if fmt in ("MXFP8", "MXFP4"):
        meta = torch.randint(120, 136, (rows * ck // 32,), dtype=torch.uint8, device="cuda")
    elif fmt == "NVFP4":
        meta = torch.randint(0x30, 0x40, (rows * ck // 16,), dtype=torch.uint8, device="cuda")
    elif fmt == "Q8_0":
        meta = fp16_bytes(rows * 2)
    elif fmt.startswith("IQ2"):
        meta = fp16_bytes(rows)
        tables = torch.from_numpy(mma_layout.iq2_tables(fmt).view(np.int32)).to("cuda")
        if fmt == "IQ2_XS":
            meta2 = torch.randint(0, 256, (rows * 8,), dtype=torch.uint8, device="cuda")
    elif fmt == "FP8_BLOCK":
        block_scale = torch.full((-(-n // 128), -(-k // 128)), 0.01, device="cuda")
    return gemm.MmaShard(fmt, format_id(fmt), 0, n, k, chunks, codes, meta, meta2, block_scale,
                             tables, 0.01, pdl=pdl.enabled())  # fmt: skip


def config_label(c: gemm.MmaConfig) -> str:
    """tokens-tile/splits/rows-a-CTA, "r" when the activations are resident."""
    return f"{c.mt}/{c.splits}/{16 * c.tiles}{'r' if c.resident else ''}"


def shard_bytes(s: gemm.MmaShard) -> int:
    return sum(t.numel() * t.element_size() for t in (s.codes, s.meta, s.meta2, s.block_scale) if t is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default=FORMATS)
    parser.add_argument("--ms", default=MS)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument(
        "--sweep-one-token",
        action="store_true",
        help="--sweep at one-token tiles: also CTA heights of 96/112 rows, resident activations",
    )
    parser.add_argument("--model", default="70b", choices=sorted(MODELS))
    parser.add_argument("--occupancy-rule", action="store_true",
                        help="at one-token tiles also time the K splits that fill the kernel's occupancy")  # fmt: skip
    parser.add_argument("--rt", default="1,2", help="row tiles per warp to time (the kernel's rt)")
    parser.add_argument("--pdl-ab", action="store_true", help="also time the defaults without programmatic launch")
    parser.add_argument("--per-linear", action="store_true", help="also time each linear alone")
    parser.add_argument("--balance-ab", action="store_true", help="one-token tiles: also configure.balanced_config")
    parser.add_argument(
        "--resident-ab",
        action="store_true",
        help="one-token tiles: also the defaults with resident activations toggled (MmaConfig.resident)",
    )
    parser.add_argument(
        "--x-quant-ab",
        action="store_true",
        help="one-token tiles: each quantized activation mode by the operand pass + the kernel, and quantized in the "
        "kernel where it holds them (MmaShard.args's x_quant)",
    )
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--out", default="mma_linear.json")
    parser.add_argument("--png", default=None)
    args = parser.parse_args()
    args.rts = [int(r) for r in args.rt.split(",")]
    shapes = MODELS[args.model]
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()
    ms = [int(m) for m in args.ms.split(",")]
    layer_params = sum(n * k for _, n, k in shapes)
    name = torch.cuda.get_device_name()
    layer = f"Llama-3.1-{args.model.upper()} layer"
    print(f"# {name}: copy {bw:.0f} GB/s, {sms} SMs; {layer}, {layer_params / 1e6:.0f} M weights")

    def layer_copies(make, nbytes):
        return [[make(n, k) for _, n, k in shapes] for _ in range(copies_for(nbytes))]

    bf16 = layer_copies(lambda n, k: torch.randn(n, k, dtype=torch.bfloat16, device="cuda"), 2 * layer_params)
    fp8 = [[w.to(torch.float8_e4m3fn) for w in layer] for layer in bf16[: copies_for(layer_params)]]
    one = torch.ones((), device="cuda")
    rows, base = [], {}
    for m in ms:
        xs = {k: torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for k in {k for _, _, k in shapes}}
        xq = {k: torch.randn(max(16, -(-m // 16) * 16), k, device="cuda").to(torch.float8_e4m3fn) for k in xs}
        t_bf16 = time_graph(lambda i: [F.linear(xs[w.shape[1]], w) for w in bf16[i]], len(bf16), args.replays)
        t_fp8 = time_graph(
            lambda i: [torch._scaled_mm(xq[w.shape[1]], w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                       for w in fp8[i]], len(fp8), args.replays)  # fmt: skip
        base[m] = (t_bf16, t_fp8)
        for name, t, nbytes in (("bf16 F.linear", t_bf16, 2 * layer_params), ("fp8 _scaled_mm", t_fp8, layer_params)):
            rows.append(dict(m=m, format=name, config="", us=t, gbs=nbytes / t / 1e3, speedup_bf16=t_bf16 / t))
            print(f"M={m:<5} {name:<16} {t:9.1f} µs  {nbytes / t / 1e3:6.0f} GB/s  {t_bf16 / t:5.2f}x bf16", flush=True)
    bf16 = fp8 = None  # free the baselines' weights before the quantized ones
    torch.cuda.empty_cache()

    for fmt in args.formats.split(","):
        one_layer = [random_shard(fmt, n, k) for _, n, k in shapes]
        nbytes = sum(shard_bytes(s) for s in one_layer)
        layers = [one_layer] + [[random_shard(fmt, n, k) for _, n, k in shapes] for _ in range(copies_for(nbytes) - 1)]
        # the same weights launched with and without programmatic dependent launch (what B12X_PDL=1 / 0 pack)
        by_pdl = {flag: [[dataclasses.replace(s, pdl=flag, packed={}) for s in layer] for layer in layers]
                  for flag in (1, 0)}  # fmt: skip
        for m in ms:
            xs = {k: torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for k in {k for _, _, k in shapes}}
            ys = {n: torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _, n, _ in shapes}
            xq = {k: torch.empty_like(x) for k, x in xs.items()}  # --x-quant-ab's operand pass writes these

            def timed(configs, copies=layers, only=None, x_quant=("", "")):
                """The layer's time under `configs` (one per linear), or linear `only`'s alone. `x_quant` (mode, how):
                how "pass" quantizes each linear's activations first (b12x_kernels.act_quant, as the mode's operand
                pass does), "kernel" lets resident configurations quantize them where they are held (x_quant)."""
                wss = [
                    gemm.MmaWorkspace.create(m, s.n, c.splits, c.mt, "cuda", row_tiles=c.tiles)
                    for s, c in zip(one_layer, configs, strict=True)
                ]

                def layer(i):
                    for li, (s, c, ws) in enumerate(zip(copies[i], configs, wss, strict=True)):
                        if only is None or li == only:
                            x, (mode, how), held = xs[s.k], x_quant, "none"
                            input_scale = X_QUANT_INPUT_SCALES.get(mode)
                            if how == "kernel" and c.resident:
                                held = mode
                            elif mode:  # what TensorCoreGemm.run does before the kernel
                                x, _ = operands.bf16_operands(x, mode, input_scale, [xq[s.k], None])
                            scale = operands.in_kernel_scale(held, input_scale)
                            gemm.run(x, [s], ys[s.n], None, c, ws, torch.cuda.current_stream().cuda_stream,
                                     x_quant=held, x_quant_scale=scale)  # fmt: skip

                return time_graph(layer, len(layers), args.replays)

            def runs(s, c) -> bool:
                """Whether the extension runs shard s under c (it refuses resident rows past shared memory), tried
                once outside the graph so that a refusal does not break a capture."""
                ws = gemm.MmaWorkspace.create(m, s.n, c.splits, c.mt, "cuda", row_tiles=c.tiles)
                try:
                    gemm.run(xs[s.k], [s], ys[s.n], None, c, ws, torch.cuda.current_stream().cuda_stream)
                except ValueError as refused:
                    print(f"    {s.n}x{s.k} {config_label(c)}: {refused}", flush=True)
                    return False
                return True

            def per_linear(configs, x_quant=("", "")):
                return {lname: timed(configs, only=li, x_quant=x_quant) for li, (lname, _, _) in enumerate(shapes)}

            mt = configure.token_tile(m)
            results = []
            for rt in args.rts:
                concurrent_ctas = geometry.concurrent_ctas_here(fmt, mt, "cuda", rt)
                defaults = [configure.default_config(m, s.n, s.chunks, concurrent_ctas, rt=rt, sms=sms,
                                                     share=configure.split_share(fmt, m, s.k), fmt=fmt)
                            for s in one_layer]  # fmt: skip
                label = f"rt{rt} " + " ".join(config_label(c) for c in defaults)
                if args.pdl_ab:
                    results.append((timed(defaults, by_pdl[1]), f"pdl {label}"))
                    results.append((timed(defaults, by_pdl[0]), f"no pdl {label}"))
                else:
                    results.append((timed(defaults), label, per_linear(defaults) if args.per_linear else None))
                if args.balance_ab and mt == 1 and rt == 1:  # 128-row CTAs beside the default's balanced heights
                    alt = [
                        configure.default_config(m, s.n, s.chunks, concurrent_ctas, sms=sms, balance=False)
                        for s in one_layer
                    ]
                    alabel = "128-row rt1 " + " ".join(config_label(c) for c in alt)
                    results.append((timed(alt), alabel, per_linear(alt) if args.per_linear else None))
                if args.resident_ab and mt == 1 and rt == 1:  # the same CTAs and splits, resident activations toggled
                    flipped = [dataclasses.replace(c, resident=not c.resident) for c in defaults]
                    flabel = "toggled " + " ".join(config_label(c) for c in flipped)
                    results.append((timed(flipped), flabel, per_linear(flipped) if args.per_linear else None))
                if args.x_quant_ab and mt == 1 and rt == 1:  # each quantized mode: the operand pass, then in-kernel
                    for mode in [mode for mode, formats in geometry.MMA.x_quant_formats.items() if fmt in formats]:
                        # in the kernel: the mode's own defaults (held past one token where holds_resident says so)
                        held = [configure.default_config(m, s.n, s.chunks, concurrent_ctas, sms=sms, fmt=fmt,
                                                         act_mode=mode, share=configure.split_share(fmt, m, s.k))
                                for s in one_layer]  # fmt: skip
                        for how, configs in (("pass", defaults), ("kernel", held)):
                            linears = per_linear(configs, (mode, how)) if args.per_linear else None
                            hlabel = "rt1 " + " ".join(config_label(c) for c in configs)
                            results.append(
                                (timed(configs, x_quant=(mode, how)), f"{mode} by the {how} {hlabel}", linears)
                            )
                if args.occupancy_rule and mt == 1:  # the split rule before STREAMING_CTAS_PER_SM, in the same run
                    filled = [configure.default_config(m, s.n, s.chunks, concurrent_ctas, rt=rt) for s in one_layer]
                    results.append(
                        (timed(filled), f"occupancy rt{rt} " + " ".join(f"{c.mt}/{c.splits}" for c in filled))
                    )
            if args.sweep:  # each linear's best configuration, varied one linear at a time
                best = [configure.default_config(m, s.n, s.chunks, geometry.concurrent_ctas_here(fmt, mt, "cuda"),
                                                 sms=sms, share=configure.split_share(fmt, m, s.k), fmt=fmt)
                        for s in one_layer]  # fmt: skip
                for li, s in enumerate(one_layer):
                    cands = [gemm.MmaConfig(mt, sp, rt) for mt in geometry.TOKEN_TILES if 8 * mt <= max(8, 2 * m)
                             for sp in (1, 2, 3, 4, 6, 8, 12, 16) if sp <= s.chunks for rt in args.rts]  # fmt: skip
                    if args.sweep_one_token:  # one-token tiles: CTA heights of 6-8 row tiles, staged or resident
                        cands += [gemm.MmaConfig(1, c.splits, 1, tiles, resident) for c in cands
                                  if c.mt == 1 and c.rt == 1 for tiles in (6, 7, 8) for resident in (False, True)
                                  if (tiles, resident) != (8, False)]  # fmt: skip
                    timings = []
                    for c in cands:
                        if not runs(s, c):
                            continue
                        trial = list(best)
                        trial[li] = c
                        timings.append((timed(trial), c))
                    best[li] = min(timings, key=lambda r: r[0])[1]
                results.append((timed(best), "best " + " ".join(f"rt{c.rt} {config_label(c)}" for c in best)))
            t_bf16, t_fp8 = base[m]
            for t, label, *linears in results:
                gbs = nbytes / t / 1e3
                row = dict(m=m, format=fmt, config=label, us=t, gbs=gbs, pct_copy=100 * gbs / bw,
                           speedup_bf16=t_bf16 / t, speedup_fp8=t_fp8 / t)  # fmt: skip
                if linears and linears[0]:  # µs and % of copy of each linear alone
                    row["linears"] = {
                        lname: {"us": lt, "pct_copy": 100 * shard_bytes(s) / lt / 1e3 / bw}
                        for (lname, lt), s in zip(linears[0].items(), one_layer, strict=True)
                    }
                rows.append(row)
                print(f"M={m:<5} {fmt:<16} {t:9.1f} µs  {row['gbs']:6.0f} GB/s ({row['pct_copy']:3.0f}%)  "
                      f"{row['speedup_bf16']:5.2f}x bf16  {row['speedup_fp8']:5.2f}x fp8  [{label}]",
                      flush=True)  # fmt: skip
                for lname, lv in row.get("linears", {}).items():
                    print(f"    {lname:<8} {lv['us']:8.1f} µs ({lv['pct_copy']:3.0f}%)", flush=True)
        layers = one_layer = None  # free this format's copies
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_gbs": bw, "sms": sms, "rows": rows}, f, indent=1)
    if args.png:
        plot(rows, args.png)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    names = dict.fromkeys(r["format"] for r in rows)
    for name in names:
        pts = sorted(
            (r["m"], r["speedup_bf16"]) for r in rows if r["format"] == name and not r["config"].startswith("best")
        )
        ax.plot(*zip(*pts, strict=True), marker="o", label=name, linestyle="--" if " " in name else "-")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens (M)")
    ax.set_ylabel("speed-up over bf16 F.linear (same run)")
    ax.set_title("Llama-3.1-70B decoder layer (4 linears), H200: b12x tensor-core GEMM")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
