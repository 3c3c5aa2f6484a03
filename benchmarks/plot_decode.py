"""Roofline-style plot of a decode_linear.py result: achieved weight-read GB/s per format and M, against the
measured copy bandwidth.

    python benchmarks/plot_decode.py RESULT.json OUT.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(result: str, out: str) -> None:
    data = json.load(open(result))
    shapes = sorted({r["shape"] for r in data["rows"]}, key=lambda s: -int(s.split("x")[0]) * int(s.split("x")[1]))
    formats = list(dict.fromkeys(r["format"] for r in data["rows"]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4.2), sharey=True)
    for ax, shape in zip(axes, shapes, strict=True):
        for fmt in formats:
            rows = [r for r in data["rows"] if r["shape"] == shape and r["format"] == fmt]
            ax.plot([r["m"] for r in rows], [r["gbs"] for r in rows], marker="o", label=fmt)
        ax.axhline(data["copy_gbs"], color="black", linestyle="--", linewidth=1, label="device copy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens (M)")
        ax.set_title(f"weights {shape}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("weight bytes read / time (GB/s)")
    axes[-1].legend(fontsize=8)
    fig.suptitle(f"decode linear on {data['device']} (CUDA graphs, weights rotated past L2)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
