"""Where does FP8 × fp8 lose against a bare fp8 GEMM? On Llama-3.1-8B's four linears, in one run: bf16 `F.linear`,
`torch._scaled_mm` with tensor-wise scales (one float each), with row-wise scales (a column for the tokens, a row for
the weight: what per-token activations or fused shards with their own factors need), the activation quantizer alone
(b12x_kernels.act_quant.quantize_fp8, static and per-token), and the scaled_mm backend (quantizer + GEMM).

    python benchmarks/scaled_mm_scales.py --out scaled_mm_scales.json [--ms 64,128,256,1024]

Timing as benchmarks/decode_linear.py: CUDA graphs over weight copies larger than L2 together, median of the replays.
Prints the layer's µs per variant and M with × bf16.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from decode_linear import device_facts, saved_or_measured, time_graph
from plan_check import BUDGET_MS, MODELS, copies_for, random_weight

import b12x_core as bc
from b12x_core.kernels import act_quant

VARIANTS = ("bf16", "tensorwise", "rowwise", "quantize_static", "quantize_token", "scaled_mm_static",
            "scaled_mm_token")  # fmt: skip


def measure(args) -> dict:
    device = torch.device("cuda")
    ms = [int(m) for m in args.ms.split(",")]
    out = {**device_facts(device), "ms": ms, "rows": []}
    e4m3 = torch.float8_e4m3fn
    for name, (n, k) in MODELS["8b"].items():
        w16 = torch.randn(n, k, dtype=torch.bfloat16, device=device)
        copies = copies_for(w16.numel() * 2, device)
        w16s = [w16.clone() for _ in range(copies)]
        w8s = [(w / 16).to(e4m3) for w in w16s]
        one = torch.ones((), dtype=torch.float32, device=device)
        col_b = torch.full((1, n), 0.5, dtype=torch.float32, device=device)
        qw = random_weight("FP8", n, k, True)
        static = [bc.prepare_linear(qw, device=device, max_tokens=max(ms), activation="fp8") for _ in range(copies)]
        token = [bc.prepare_linear(random_weight("FP8", n, k, False), device=device, max_tokens=max(ms),
                                   activation="fp8") for _ in range(copies)]  # fmt: skip
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            rows16 = -(-m // 16) * 16
            x8 = torch.zeros(rows16, k, dtype=torch.uint8, device=device).view(e4m3)
            col_a = torch.ones(rows16, 1, dtype=torch.float32, device=device)
            codes = torch.empty(rows16, k, dtype=torch.uint8, device=device)
            scale = torch.empty(rows16, 1, dtype=torch.float32, device=device)
            calls = {
                "bf16": lambda i: F.linear(x, w16s[i]),
                "tensorwise": lambda i: torch._scaled_mm(x8, w8s[i].t(), scale_a=one, scale_b=one,
                                                         out_dtype=torch.bfloat16),
                "rowwise": lambda i: torch._scaled_mm(x8, w8s[i].t(), scale_a=col_a, scale_b=col_b,
                                                      out_dtype=torch.bfloat16),
                "quantize_static": lambda i: act_quant.quantize_fp8(x, "fp8_static", codes, scale, 0.02, rows=rows16),
                "quantize_token": lambda i: act_quant.quantize_fp8(x, "fp8_token", codes, scale, 0.0, rows=rows16),
                "scaled_mm_static": lambda i: bc.linear(x, static[i]),
                "scaled_mm_token": lambda i: bc.linear(x, token[i]),
            }  # fmt: skip
            for variant in VARIANTS:
                us = time_graph(calls[variant], copies, replays=args.replays, budget_ms=BUDGET_MS)
                out["rows"].append(dict(linear=name, m=m, variant=variant, us=us))
            print(f"  {name} M={m} done", flush=True)
        w16s.clear(), w8s.clear(), static.clear(), token.clear()
    return out


def summary(out: dict) -> list[str]:
    layer: dict[tuple, float] = {}
    for r in out["rows"]:
        layer[(r["variant"], r["m"])] = layer.get((r["variant"], r["m"]), 0.0) + r["us"]
    lines = [f"{out['device']}, Llama-3.1-8B layer (4 linears), µs (× bf16)", "M      " + "".join(f"{v:>22}" for v in
                                                                                      VARIANTS)]  # fmt: skip
    for m in out["ms"]:
        bf16 = layer[("bf16", m)]
        cells = "".join(f"{layer[(v, m)]:>14.1f} ({bf16 / layer[(v, m)]:4.2f}×)" for v in VARIANTS)
        lines.append(f"{m:<7}{cells}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="scaled_mm_scales.json")
    parser.add_argument("--ms", default="64,128,256,512,1024,4096")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--from-json", default="", help="no measuring: print the summary of a saved --out file")
    args = parser.parse_args()
    print("\n".join(summary(saved_or_measured(args, measure))))


if __name__ == "__main__":
    main()
