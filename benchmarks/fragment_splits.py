"""Which K split should the decode-sized GEMM on the CUTLASS layout (fragment_mma) use at each M? Splits 1, 2, 4, 8, 16
(and the rule's, `fragment_mma.k_splits`) for the backend alone on Llama-3.1-8B's (or 70B's) four linears, against
bf16 `F.linear` in the same run.

    python benchmarks/fragment_splits.py --out fragment_splits.json
    python benchmarks/fragment_splits.py --formats NVFP4 --ms 1,8,16 --model 70b

Timing as benchmarks/decode_linear.py: CUDA graphs over weight copies larger than L2 together, median of the replays.
Prints, per format and M, the layer's µs for each split (each linear at that split, capped at its K / 256), the layer
with each linear at its fastest split, the rule's and bf16; writes every per-linear time to --out.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from decode_linear import device_facts, saved_or_measured, time_graph
from plan_check import BUDGET_MS, MODELS, copies_for, random_weight

import b12x_core as bc
from b12x_core import plan, workspace
from b12x_core.backends.fragment_mma import STEP_TILES, FragmentMma, k_splits
from b12x_core.backends.sm90_layout import TILE_K
from b12x_core.weights import DeviceWeights, as_shards

SPLITS = (1, 2, 4, 8, 16)


def measure(args) -> dict:
    device = torch.device("cuda")
    ms = [int(m) for m in args.ms.split(",")]
    out = {**device_facts(device), "model": args.model, "ms": ms, "rows": []}
    for name, (n, k) in MODELS[args.model].items():
        w16 = torch.randn(n, k, dtype=torch.bfloat16, device=device)
        copies16 = copies_for(w16.numel() * 2, device)
        ws16 = [w16.clone() for _ in range(copies16)]
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            us = time_graph(lambda i, x=x: F.linear(x, ws16[i]), copies16, replays=args.replays, budget_ms=BUDGET_MS)
            out["rows"].append(dict(linear=name, format="bf16", m=m, splits=0, rule=0, us=us))
        ws16.clear()
        for fmt in args.formats.split(","):
            qw = random_weight(fmt, n, k, False)
            copies = copies_for(qw.nbytes, device)
            query = bc.prepare_linear(qw, device=device, max_tokens=max(ms)).plan.query
            plans = [plan.build(query, DeviceWeights(as_shards(qw), "bf16", None, device), only=FragmentMma)
                     for _ in range(copies)]  # fmt: skip
            for m in ms:
                x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
                rule = k_splits(n, k, m, query.device.sms)
                for splits in sorted({s for s in SPLITS if s <= k // TILE_K // STEP_TILES} | {rule}):

                    def call(i, m=m, x=x, splits=splits):
                        row = plans[i].for_tokens(m)
                        return row.backend.run(x, None, config=row.config | {"splits": splits})

                    # the plan reserved its own split's tickets and scratch; this split's may need more
                    config = plans[0].for_tokens(m).config | {"splits": splits}
                    for p in plans:
                        backend = p.for_tokens(m).backend
                        backend.tickets_needed = max(backend.tickets_needed, backend.tickets_of(m, config))
                        workspace.reserve_tickets(device, backend.tickets_needed)
                        workspace.reserve_scratch(device, backend.scratch_bytes(m, config))
                    us = time_graph(call, copies, replays=args.replays, budget_ms=BUDGET_MS)
                    out["rows"].append(dict(linear=name, format=fmt, m=m, splits=splits, rule=rule, us=us))
                print(f"  {name} {fmt} M={m} done", flush=True)
            plans.clear()
    return out


def summary(out: dict) -> list[str]:
    """Per format and M: the layer's µs at each split, at each linear's fastest split and at the rule's, and bf16."""
    lines = [f"{out['device']}, Llama-3.1-{out['model'].upper()} layer (4 linears), µs; × = bf16 / layer", ""]
    rows = out["rows"]
    for fmt in sorted({r["format"] for r in rows} - {"bf16"}):
        lines.append(fmt)
        for m in out["ms"]:
            bf16 = sum(r["us"] for r in rows if r["format"] == "bf16" and r["m"] == m)
            mine = [r for r in rows if r["format"] == fmt and r["m"] == m]
            linears = sorted({r["linear"] for r in mine})
            per_split = {}
            for s in SPLITS:
                # each linear at split s, or at its largest measured split where s is past its K
                per_split[s] = sum(min((r for r in mine if r["linear"] == lin and r["splits"] <= s),
                                       key=lambda r: -r["splits"])["us"] for lin in linears)  # fmt: skip
            best = sum(min(r["us"] for r in mine if r["linear"] == lin) for lin in linears)
            at_rule = [r for r in mine if r["splits"] == r["rule"]]
            rule = sum(next(r["us"] for r in at_rule if r["linear"] == lin) for lin in linears)
            cells = "  ".join(f"{s}:{us:7.1f}" for s, us in per_split.items())
            lines.append(f"  M={m:<4} bf16 {bf16:7.1f}  {cells}  best {best:7.1f} ({bf16 / best:4.2f}×)  "
                         f"rule {rule:7.1f} ({bf16 / rule:4.2f}×)")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="fragment_splits.json")
    parser.add_argument("--model", default="8b", choices=sorted(MODELS))
    parser.add_argument("--formats", default="NVFP4,MXFP4")
    parser.add_argument("--ms", default="1,4,8,16,32")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--from-json", default="", help="no measuring: print the summary of a saved --out file")
    args = parser.parse_args()
    print("\n".join(summary(saved_or_measured(args, measure))))


if __name__ == "__main__":
    main()
