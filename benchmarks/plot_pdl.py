"""Programmatic dependent launch against plain launches, from `mma_linear.py --pdl-ab` runs: per format and token
count, the layer's time without PDL over its time with it (each run against its own plain launches, so runs of
different kernels can share one plot).

    python benchmarks/plot_pdl.py OUT.png "LABEL=RUN.json" ["LABEL=RUN.json" ...]
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def speedups(path: str) -> dict[str, dict[int, float]]:
    """{format: {m: plain µs / PDL µs}} of one run."""
    times: dict[tuple[str, int], dict[str, float]] = {}
    for r in json.load(open(path))["rows"]:
        for tag in ("no pdl ", "pdl "):
            if r["config"].startswith(tag):
                times.setdefault((r["format"], r["m"]), {})[tag.strip()] = r["us"]
                break
    out: dict[str, dict[int, float]] = {}
    for (fmt, m), t in times.items():
        if {"pdl", "no pdl"} <= set(t):
            out.setdefault(fmt, {})[m] = t["no pdl"] / t["pdl"]
    return out


def main(png: str, runs: list[str]) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, run in enumerate(runs):
        label, path = run.split("=", 1)
        for fmt, by_m in speedups(path).items():
            ms = sorted(by_m)
            ax.plot(ms, [by_m[m] for m in ms], marker="o", linestyle=["-", "--", ":"][i % 3], label=f"{fmt}, {label}")
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens (M)")
    ax.set_ylabel("plain time / PDL time (same run)")
    ax.set_title("Llama-3.1-8B layer's four linears back to back, H200")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
