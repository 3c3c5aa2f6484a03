"""Where b12x stands: the dispatched `bc.linear` per decoder layer against bf16 `F.linear` of the same run, per
model, format × activation mode and M, from several plan_check.py runs, each cell taken from the LAST file given
that measured it (list the runs oldest first); and the same for the fused MoE from benchmarks/moe.py runs (its
"auto" rows: the dispatched `bc.moe` against the bf16 grouped MoE of the same run, per layer shape, format × mode and
T). Every cell says which run it came from (a letter; the runs and their dates are listed under each table),
because an older cell measured the kernels of its day.

    python benchmarks/standing.py RUN.json [RUN.json ...] [--png standing.png] > standing.md
    python benchmarks/standing.py @docs/results/standing_runs.txt --png ...   (the runs listed a line each)
"""

from __future__ import annotations

import argparse
import json
import string
from dataclasses import dataclass
from pathlib import Path

import plan_check


@dataclass(frozen=True)
class Cell:
    speedup: float  # bf16 µs / dispatched µs, the same run's
    us: float
    run: int  # index into the runs given


MOE = " MoE"  # a group's suffix for a moe.py layer shape ("qwen3 MoE"): its tables count tokens T, not M


def moe_layers(rows: list[dict]) -> list[dict]:
    """A moe.py run's dispatched MoE (its "auto" rows) as plan_check.layers gives a linear run's layers."""
    return [dict(model=r["shape"] + MOE, label=f"{r['format']} × {r['act']}", m=r["t"], us=r["us"],
                 speedup=r["speedup"]) for r in rows if r.get("backend") == "auto"]  # fmt: skip


def merge(runs: list[list[dict]]) -> dict[tuple[str, str, int], Cell]:
    """(model or MoE shape, label, M or T) -> the cell of the last run that measured the whole layer there."""
    cells = {}
    for i, rows in enumerate(runs):
        moe = any("backend" in r and "t" in r for r in rows)
        for layer in moe_layers(rows) if moe else plan_check.layers(rows):
            cells[(layer["model"], layer["label"], layer["m"])] = Cell(layer["speedup"], layer["us"], i)
    return cells


def groups(cells: dict) -> list[str]:
    """The tables, in order: the linear models, then the MoE shapes."""
    moe = sorted({key[0] for key in cells if key[0].endswith(MOE)})
    return [m for m in plan_check.MODELS if any(key[0] == m for key in cells)] + moe


def baseline(group: str) -> str:
    return "the bf16 grouped MoE" if group.endswith(MOE) else "bf16 `F.linear`"


def count(group: str) -> str:
    return "T" if group.endswith(MOE) else "M"


def markdown(cells: dict, names: list[str], dates: list[str]) -> str:
    # a letter for each run that gave a cell, in the order the runs were given
    letters = dict(zip(sorted({c.run for c in cells.values()}), string.ascii_letters, strict=False))
    out = []
    for model in groups(cells):
        here = {key: c for key, c in cells.items() if key[0] == model}
        ms = sorted({m for _, _, m in here})
        labels = sorted({label for _, label, _ in here})
        out.append(f"**{model}** (× {baseline(model)}; the letter names the run)\n")
        out.append("| format × activations | " + " | ".join(f"{count(model)}={m}" for m in ms) + " |")
        out.append("|---|" + "---:|" * len(ms))
        for label in labels:
            row = []
            for m in ms:
                c = here.get((model, label, m))
                row.append("—" if c is None else f"{c.speedup:.2f}<sup>{letters[c.run]}</sup>")
            out.append(f"| {label} | " + " | ".join(row) + " |")
        used = sorted({c.run for c in here.values()})
        out.append("\n" + "; ".join(f"<sup>{letters[i]}</sup> `{names[i]}` ({dates[i]})" for i in used) + "\n")
    return "\n".join(out)


def plot(cells: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    models = groups(cells)
    fig, axes = plt.subplots(len(models), 1, figsize=(12, 5.5 * len(models)), squeeze=False)
    norm = TwoSlopeNorm(vmin=0.3, vcenter=1.0, vmax=2.5)
    for ax, model in zip(axes[:, 0], models, strict=True):
        here = {k: c for k, c in cells.items() if k[0] == model}
        ms = sorted({m for _, _, m in here})
        labels = sorted({label for _, label, _ in here})
        grid = [[here[(model, label, m)].speedup if (model, label, m) in here else float("nan") for m in ms]
                for label in labels]  # fmt: skip
        image = ax.imshow(grid, cmap="RdYlGn", norm=norm, aspect="auto")
        for y, line in enumerate(grid):
            for x, value in enumerate(line):
                if value == value:  # not NaN
                    ax.text(x, y, f"{value:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(ms)), [str(m) for m in ms])
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_xlabel(f"{count(model)} (tokens)")
        what = "bc.moe per MoE layer" if model.endswith(MOE) else "bc.linear per decoder layer"
        ax.set_title(f"{model}: dispatched {what}, × {baseline(model).replace('`', '')} of the same run")
        fig.colorbar(image, ax=ax, fraction=0.02)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 fromfile_prefix_chars="@")  # fmt: skip
    ap.add_argument("runs", nargs="+", help="plan_check.py and moe.py --out JSON files, oldest first")
    ap.add_argument("--png", default="", help="also draw the tables as heat maps")
    args = ap.parse_args()
    saved = [json.loads(Path(p).read_text()) for p in args.runs]
    cells = merge([s["rows"] for s in saved])
    if len({c.run for c in cells.values()}) > len(string.ascii_letters):
        ap.error(f"more than {len(string.ascii_letters)} runs give cells (a letter each)")
    if not cells:
        print("no run measured a whole decoder layer or a dispatched MoE")
        return 1
    print(markdown(cells, [Path(p).name for p in args.runs], [s.get("date") or "?" for s in saved]))
    if args.png:
        plot(cells, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
