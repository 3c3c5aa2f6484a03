"""A kernel change against the kernel it replaces, from `wgmma_linear.py` runs made by `tools/kernel_ab.sh` (one run
a build, both on the same GPU): per format and token count, the changed kernel's layer time over the base's, each at
its best token tile. Below 1 the change is faster.

    python benchmarks/plot_ab.py OUT.png "LABEL=BASE.json,NEW.json" ["LABEL=BASE.json,NEW.json" ...]
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def best_times(path: str) -> dict[tuple[str, int], float]:
    """{(format, m): µs} of a run's wgmma rows at their best token tile."""
    return {(r["format"], r["m"]): r["us"] for r in json.load(open(path))["rows"] if r["kernel"] == "wgmma"}


def ratios(spec: str) -> dict[str, dict[int, float]]:
    """{format: {m: new µs / base µs}} of one A/B: "BASE.json,NEW.json"."""
    base_path, new_path = spec.split(",")
    base, new = best_times(base_path), best_times(new_path)
    out: dict[str, dict[int, float]] = {}
    for key in sorted(base.keys() & new.keys()):
        out.setdefault(key[0], {})[key[1]] = new[key] / base[key]
    return out


STYLES = ["-", "--", ":", "-.", (0, (3, 1, 1, 1)), (0, (5, 2))]


def main(png: str, runs: list[str]) -> None:
    """One panel for FP4 and one for the other formats; a colour per change (runs of one LABEL share it), a line
    style per format."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    labels = list(dict.fromkeys(run.split("=", 1)[0] for run in runs))
    formats: list[str] = []
    for run in runs:
        label, spec = run.split("=", 1)
        for fmt, by_m in ratios(spec).items():
            formats += [fmt] if fmt not in formats else []
            ms = sorted(by_m)
            ax = axes[0 if fmt in ("NVFP4", "MXFP4") else 1]
            ax.plot(ms, [by_m[m] for m in ms], marker="o", linestyle=STYLES[formats.index(fmt) % len(STYLES)],
                    color=f"C{labels.index(label)}", label=f"{label}: {fmt}")  # fmt: skip
    for ax, title in zip(axes, ("FP4", "8-bit and IQ2"), strict=True):
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens (M), Llama-3.1-8B decoder layer")
        ax.set_title(f"{title}: changed kernel / base kernel (same run)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("layer time ratio (below 1: the change is faster)")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2:])
