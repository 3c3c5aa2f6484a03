"""A summary of one kernel's Nsight Compute source page (the CSV tools/kernel_profile.sh writes with NCU_SOURCE):
instruction mix by opcode (share of warp instructions executed), warp stall samples by opcode, the instructions with
the most samples, and, given the GEMM's weight count, thread instructions a weight.

    python tools/ncu_source_summary.py ncu_source.csv [--weights 117440512] [--top 20]
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter


def opcode(sass: str) -> str:
    """The opcode of a SASS line, without its predicate and modifiers: '@!P0 LDS.U.128 R4, [R2]' -> 'LDS'."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--weights", type=int, default=0, help="the GEMM's weights (N × K): thread instructions each")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    with open(args.csv, newline="") as f:
        lines = f.read().splitlines()
    kernel = lines[0].split(",", 1)[1].strip().strip('",') if lines and lines[0].startswith('"Kernel Name"') else ""
    rows = list(csv.DictReader(lines[1:] if kernel else lines))
    executed, samples, thread = Counter(), Counter(), 0
    for row in rows:
        op = opcode(row["Source"])
        executed[op] += int(row["Instructions Executed"] or 0)
        samples[op] += int(row["Warp Stall Sampling (All Samples)"] or 0)
        thread += int(row["Thread Instructions Executed"] or 0)
    total, sampled = sum(executed.values()), sum(samples.values())
    print(f"## {kernel}")
    per_weight = f" ({thread / args.weights:.2f} thread instructions a weight)" if args.weights else ""
    print(f"warp instructions executed {total}{per_weight}, stall samples {sampled}")
    print("mix: " + ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in executed.most_common(16)))
    print("samples: " + ", ".join(f"{op} {100 * n / sampled:.1f}%" for op, n in samples.most_common(12)))
    hottest = sorted(rows, key=lambda r: -int(r["Warp Stall Sampling (All Samples)"] or 0))[: args.top]
    for row in hottest:
        address = row["Address"][-5:]
        print(f"  {row['Warp Stall Sampling (All Samples)']:>6} {address} {row['Source'].strip():<64} "
              f"exec {row['Instructions Executed']}")  # fmt: skip


if __name__ == "__main__":
    main()
