"""The docs/performance.md tables of a GPU run, from the raw JSON that plan_check.py and moe.py wrote.

    python benchmarks/report.py --linear linear.json --moe moe.json > rows.md

Linear: per model, the decoder layer's four linears summed, dispatched bc.linear in µs and × bf16 F.linear of
the same run, per format × activation mode and M; then the plan check (dispatched ≤ 1.15× the fastest backend on
the plan's weight copy). MoE: per shape, bc.moe in µs, × the bf16 grouped MoE of the same run and the backend the
plan ran, per format × activation and T; then the MoE plan check. A file cut short reports what it holds.
"""

from __future__ import annotations

import argparse
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import moe
import plan_check


def linear_tables(saved: dict) -> str:
    rows = saved["rows"]
    layers = plan_check.layers(rows)
    out = [f"Linear, {saved.get('device', '?')} {saved.get('date', '')}: one decoder layer's four linears summed, "
           "µs (× bf16 `F.linear`, same run)\n"]  # fmt: skip
    for model in plan_check.MODELS:
        here = [r for r in layers if r["model"] == model]
        if not here:
            continue
        ms = sorted({r["m"] for r in here})
        base = {r["m"]: r["bf16_us"] for r in here}
        out.append(f"| **{model}** | " + " | ".join(f"M={m}" for m in ms) + " |")
        out.append("|---|" + "---:|" * len(ms))
        out.append("| bf16 `F.linear` | " + " | ".join(f"{base[m]:.0f}" for m in ms) + " |")
        for lab in dict.fromkeys(r["label"] for r in here):
            cells = {r["m"]: r for r in here if r["label"] == lab}
            out.append(f"| {lab} | " + " | ".join(f"{cells[m]['us']:.0f} ({cells[m]['speedup']:.2f}×)"
                                                   if m in cells else "" for m in ms) + " |")  # fmt: skip
        out.append("")
    text = io.StringIO()
    with redirect_stdout(text):
        plan_check.check(rows)
    out.append("```\n" + text.getvalue().strip() + "\n```\n")
    return "\n".join(out)


def moe_tables(saved: dict) -> str:
    rows = [r for r in saved["rows"] if r["backend"] == "auto"]
    out = [f"MoE, {saved.get('device', '?')} {saved.get('date', '')}: bc.moe, µs (× bf16 `torch._grouped_mm` MoE "
           "with routing and combine in the graph, same run) and the backend the plan ran\n"]  # fmt: skip
    for shape in dict.fromkeys(r["shape"] for r in rows):
        here = [r for r in rows if r["shape"] == shape]
        ts = sorted({r["t"] for r in here})
        out.append(f"| **{shape}** | " + " | ".join(f"T={t}" for t in ts) + " |")
        out.append("|---|" + "---:|" * len(ts))
        base = {r["t"]: r["bf16_ref_us"] for r in here}
        out.append("| bf16 grouped | " + " | ".join(f"{base[t]:.0f}" for t in ts) + " |")
        for fmt, act in dict.fromkeys((r["format"], r["act"]) for r in here):
            cells = {r["t"]: r for r in here if (r["format"], r["act"]) == (fmt, act)}
            out.append(f"| {fmt} × {act} | " + " | ".join(
                f"{cells[t]['us']:.0f} ({cells[t]['speedup']:.2f}×, {cells[t].get('dispatched_backend', '?')})"
                if t in cells else "" for t in ts) + " |")  # fmt: skip
        out.append("")
    text = io.StringIO()
    with redirect_stdout(text):
        moe.check(saved["rows"])
    out.append("```\n" + text.getvalue().strip() + "\n```\n")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--linear", nargs="*", default=[])
    parser.add_argument("--moe", nargs="*", default=[])
    args = parser.parse_args()
    for path in args.linear:
        if Path(path).exists():
            print(linear_tables(json.loads(Path(path).read_text())))
    for path in args.moe:
        if Path(path).exists():
            print(moe_tables(json.loads(Path(path).read_text())))


if __name__ == "__main__":
    main()
