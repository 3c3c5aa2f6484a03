"""Which token tile should the CUTLASS SM90 mixed-input GEMM use at each M? Every tile of
`interface.SM90_MIXED.token_tiles` for the cutlass_sm90 backends alone (each layout), on Llama-3.1-8B's (or 70B's) four
linears, against bf16 `F.linear` in the same run. The rule it checks is `cutlass_sm90.token_tile`.

    python benchmarks/sm90_tiles.py --out sm90_tiles.json
    python benchmarks/sm90_tiles.py --formats NVFP4 --forms cutlass_sm90 --ms 1,16,64 --model 70b

Timing as benchmarks/decode_linear.py: CUDA graphs over weight copies larger than L2 together, median of the replays. A
tile is timed only where it can pay (16 up to 128 tokens, 64 up to 512, 256 from 64). Prints, per format, form and M,
the layer's µs for each tile, the fastest, the rule's choice per linear and the layer at it, and bf16; writes every
per-linear time to --out.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from decode_linear import device_facts, saved_or_measured, time_graph
from plan_check import BUDGET_MS, MODELS, copies_for, random_weight

import b12x_core as bc
from b12x_core import plan
from b12x_core.backends.cutlass_sm90 import CutlassSm90, CutlassSm90Checkpoint, token_tile
from b12x_core.weights import DeviceWeights, as_shards
from b12x_kernels import interface

FORMS = {cls.name: cls for cls in (CutlassSm90, CutlassSm90Checkpoint)}
TILE_REACH = {16: (1, 128), 64: (1, 512), 128: (1, 1 << 30), 256: (64, 1 << 30)}  # the M a tile is timed at


def measure(args) -> dict:
    device = torch.device("cuda")
    ms = [int(m) for m in args.ms.split(",")]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    out = {**device_facts(device), "sms": sms, "model": args.model, "ms": ms, "rows": []}
    for name, (n, k) in MODELS[args.model].items():
        w16 = torch.randn(n, k, dtype=torch.bfloat16, device=device)
        copies16 = copies_for(w16.numel() * 2, device)
        ws16 = [w16.clone() for _ in range(copies16)]
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            us = time_graph(lambda i, x=x: F.linear(x, ws16[i]), copies16, replays=args.replays, budget_ms=BUDGET_MS)
            out["rows"].append(dict(linear=name, format="bf16", form="F.linear", m=m, tokens=0, us=us))
        ws16.clear()
        for fmt in args.formats.split(","):
            qw = random_weight(fmt, n, k, False)
            copies = copies_for(qw.nbytes, device)
            query = bc.prepare_linear(qw, device=device, max_tokens=max(ms)).plan.query
            for form in args.forms.split(","):
                cls = FORMS[form]
                plans = []
                for _ in range(copies):
                    weights = DeviceWeights(as_shards(qw), "bf16", None, device)
                    weights.shared_layout = cls.reads[0]
                    plans.append(plan.build(query, weights, only=cls))
                for m in ms:
                    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
                    for tokens in interface.SM90_MIXED.token_tiles:
                        lo, hi = TILE_REACH[tokens]
                        if not lo <= m <= hi:
                            continue

                        def call(i, m=m, x=x, tokens=tokens, plans=plans):
                            row = plans[i].for_tokens(m)
                            return row.backend.run(x, None, config=row.config | {"tokens": tokens})

                        us = time_graph(call, copies, replays=args.replays, budget_ms=BUDGET_MS)
                        out["rows"].append(dict(linear=name, format=fmt, form=form, m=m, tokens=tokens, us=us))
                    print(f"  {name} {fmt} {form} M={m} done", flush=True)
                plans.clear()
    return out


def summary(out: dict) -> list[str]:
    """Per format, form and M: the layer's µs for each tile (the four linears summed), the fastest tile, the rule's."""
    layer: dict[tuple, float] = {}
    per_linear: dict[str, dict[tuple, float]] = {}
    for r in out["rows"]:
        key = (r["format"], r["form"], r["m"], r["tokens"])
        layer[key] = layer.get(key, 0.0) + r["us"]
        per_linear.setdefault(r["linear"], {})[key] = r["us"]
    shapes, sms = MODELS[out["model"]], out.get("sms", 132)  # runs saved before "sms" was kept: an H100's
    lines = [f"{out['device']}, Llama-3.1-{out['model'].upper()} layer (4 linears), µs; × = bf16 / tile", ""]
    combos = sorted({(f, form) for f, form, _, _ in layer if f != "bf16"})
    for fmt, form in combos:
        lines.append(f"{fmt} {form}")
        for m in out["ms"]:
            bf16 = layer[("bf16", "F.linear", m, 0)]
            keys = [(fmt, form, m, t) for t in interface.SM90_MIXED.token_tiles]
            tiles = {key[3]: layer[key] for key in keys if key in layer}
            best = min(tiles, key=tiles.get)
            cells = "  ".join(f"{t}:{us:8.1f} ({bf16 / us:4.2f}×)" for t, us in tiles.items())
            # the rule's tile per linear (it depends on the shape), and the layer with each linear at it
            picks = {lin: token_tile(fmt, m, n, k, sms) for lin, (n, k) in shapes.items() if lin in per_linear}
            ruled = sum(per_linear[lin].get((fmt, form, m, t), float("nan")) for lin, t in picks.items())
            rule = "/".join(str(t) for t in dict.fromkeys(picks.values()))
            lines.append(f"  M={m:<5} bf16 {bf16:8.1f}  {cells}  best {best}, rule {rule} {ruled:8.1f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="sm90_tiles.json")
    parser.add_argument("--model", default="8b", choices=sorted(MODELS))
    parser.add_argument("--formats", default="FP8,NVFP4,MXFP4")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--ms", default="1,16,64,128,256,512,1024,4096")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--from-json", default="", help="no measuring: print the summary of a saved --out file")
    args = parser.parse_args()
    print("\n".join(summary(saved_or_measured(args, measure))))


if __name__ == "__main__":
    main()
