"""docs/performance.md, the whole page, from the measurement files it lists: plan_check.py runs (the Llama-3.1
decoder layers through `bc.linear`), moe.py runs (MoE layers through `bc.moe`) and model_decode.py runs (a whole
model's decode steps; a model with prefill chunks measured also gets a serving table: its prefill chunks beside its
batched decode steps, in tokens/s). Each cell of a table is the newest measurement of that point: the files are
given oldest first and the last one that measured a cell gives it, with a letter naming the file. Every file given
must give at least one cell, so docs/results/ holds no file the page does not cite. A cards file
(docs/results/sm12x_cards.json, "kind": "sm12x_roofline") measures nothing: it gives the SM12x roofline section, a
model worked out from the cards' published rates (sm12x_roofline.py).

    python benchmarks/performance_page.py @docs/results/performance_runs.txt > docs/performance.md
    python benchmarks/performance_page.py @docs/results/performance_runs.txt --plots docs/results > docs/performance.md

To add a measurement: put its JSON in docs/results/, add its path at the end of performance_runs.txt, rerun the
second command (it redraws the plots) and drop any file the run now reports as giving no cell. tests/test_docs.py
regenerates the page (not the plots) and fails where the committed one differs.
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
from dataclasses import dataclass
from pathlib import Path

import moe
import plan_check
import sm12x_roofline

RUNS = "docs/results/performance_runs.txt"  # the files the page reads, oldest first, a path a line
PAGE_COMMAND = f"python benchmarks/performance_page.py @{RUNS} --plots docs/results > docs/performance.md"


@dataclass(frozen=True)
class Cell:
    speedup: float  # baseline µs / b12x µs (tokens/s over bf16's for a decode step), the same run's
    us: float
    run: int  # index into the files given


@dataclass(frozen=True)
class Group:
    """One table: what it measures, its baseline and what its columns count."""

    kind: str  # "linear", "moe", "step" (decode steps), "prefill" (prefill chunks) or "serving" (their table)
    name: str  # plan_check's model, moe.py's shape or model_decode's model

    @property
    def title(self) -> str:
        return TITLES.get((self.kind, self.name), f"{self.name} ({self.kind})")

    @property
    def baseline(self) -> str:
        return {"linear": "bf16 `F.linear`", "moe": "the bf16 grouped MoE"}.get(self.kind, "the bf16 model's step")

    @property
    def count(self) -> str:
        return {"linear": "M", "moe": "T", "step": "B", "prefill": "T"}[self.kind]

    def plot_name(self, device: str) -> str:
        return f"performance_{slug(device)}_{self.kind}_{self.name}.png"


TITLES = {
    ("linear", "8b"): "Llama-3.1-8B decoder layer: its four linears through `bc.linear`",
    ("linear", "70b"): "Llama-3.1-70B decoder layer: its four linears through `bc.linear`",
    ("moe", "qwen3"): "Qwen3-30B-A3B-like MoE layer (E=128, top-8, H=2048, I=768) through `bc.moe`",
    ("moe", "gptoss"): "gpt-oss-120b-like MoE layer (E=128, top-4, H=2880, I=2880) through `bc.moe`",
    ("moe", "dsv3"): "DeepSeek-V3-like MoE layer (E=256, top-8, H=7168, I=2048) through `bc.moe`",
    ("step", "llama8b"): "Llama-3.1-8B-shaped model, one decode step (32 layers, LM head)",
    ("step", "qwen3moe"): "Qwen3-30B-A3B-shaped model, one decode step (48 MoE layers, LM head)",
    ("serving", "llama8b"): "Llama-3.1-8B-shaped model: a prefill chunk and batched decode, tokens/s",
    ("serving", "qwen3moe"): "Qwen3-30B-A3B-shaped model: a prefill chunk and batched decode, tokens/s",
}
KINDS = ("linear", "moe", "step", "serving")  # the order of the tables; a model's serving table follows its steps'
# The decode steps a serving table shows beside the prefill chunks: the batched decode of a serving workload
# (model_decode.py --serving). Every decode step measured is also in the model's decode-step table.
SERVING_DECODE = (64, 256)


def slug(device: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", device.lower().removeprefix("nvidia ")).strip("_") or "unknown"


def kind_of(rows: list[dict]) -> str:
    if any("step_us" in r for r in rows):
        return "step"
    if any("backend" in r and "t" in r for r in rows):
        return "moe"
    return "linear"


def moe_layers(rows: list[dict]) -> list[dict]:
    """A moe.py run's MoE layers as the plan runs them: its "auto" rows (the dispatched `bc.moe`); a run without them
    timed the plan's candidates alone, and then the fastest candidate (A/B forms, named with moe.LOOSE's or
    moe.UNFUSED's suffix, left out) is what a plan made from that run's table picks at that token count."""
    auto = [r for r in rows if r.get("backend") == "auto"]
    if not auto:
        best = {}
        for r in rows:
            if not any(r["backend"].endswith(s) for s in (moe.LOOSE, moe.UNFUSED)):
                key = (r["shape"], r["format"], r["act"], r["t"])
                if key not in best or r["us"] < best[key]["us"]:
                    best[key] = r
        auto = list(best.values())
    return [dict(model=r["shape"], label=f"{r['format']} × {r['act']}", m=r["t"], us=r["us"],
                 speedup=r["bf16_ref_us"] / r["us"]) for r in auto]  # fmt: skip


def step_label(fmt: str, activation: str) -> str:
    """model_decode.py's format × activation modes; earlier runs named FP8's per-token mode "fp8", later ones
    "fp8_token", and the MoE model's "bf16 moe mxfp8" gives the linears' mode, then the experts'."""
    if fmt == "FP8" and activation == "fp8":
        activation = "fp8_token"
    return f"{fmt} × " + activation.replace(" moe ", ", experts × ")


def steps(rows: list[dict]) -> list[dict]:
    """A model_decode.py run's steps, each against the bf16 model's step of the same run: decode steps of B
    sequences (kind "step"; runs from before prefill chunks existed name no "step") and prefill chunks of T tokens
    of one sequence (kind "prefill"). m counts the step's new tokens either way."""
    out = []
    for r in rows:
        prefill = r.get("step") == "prefill"
        out.append(dict(model=r["model"], kind="prefill" if prefill else "step", m=r["tokens"] if prefill else
                        r["batch"], label=step_label(r["format"], r["activation"]), us=r["step_us"],
                        speedup=r["tokens_per_s"] / r["bf16_tokens_per_s"]))  # fmt: skip
    return out


METHOD = """## Method

- **What runs.** The ops as a user calls them: `bc.linear` on a prepared layer and `bc.moe` on a prepared MoE,
  each running the plan `prepare_*` built (the backend and configuration it picked for that token count).
  A decoder layer's cell sums its four linears (qkv and gate_up fused, as vLLM runs them). The decode step is a
  whole model (`benchmarks/model_decode.py`: embedding, every layer with attention over a 512-slot KV cache,
  LM head) with b12x's linears and experts against the same model in bf16.
- **The baseline, in the same run.** Linears: bf16 `F.linear` (cuBLAS) of the same shape, for every activation
  mode (fp8 `torch._scaled_mm` is one of b12x's own backends, which the plan may pick). MoE: a bf16 grouped
  MoE (`torch._grouped_mm` for both GEMMs, routing and combine in the same graph). Each cell divides the
  baseline's time by b12x's from one file, so clocks that differ between runs cancel.
- **Timing.** CUDA graphs replayed, median of 20-100 replays between CUDA events
  (`benchmarks/decode_linear.py`'s `time_graph`). Weights come from HBM: each timed graph cycles through
  copies of the layer whose bytes together exceed the L2 cache (4× its 60 MB) for the linears; the MoE alternates
  two prepared copies (the touched experts' bytes are mostly beyond L2); in the decode step every layer has its
  own copy, so the whole model streams from HBM each step.
- **MoE cells.** A moe.py run's `auto` rows are the dispatched `bc.moe`; a run that timed the plan's
  candidates alone gives the fastest of them, which is what a plan built from that run's table
  (`timings.json`) runs at that token count.
- **Columns.** M: tokens of a linear call; T: tokens of an MoE call; B: sequences in a decode step, one new
  token each. A letter names the file a cell comes from (listed under each table and at the end); a cell from
  an older file measured the kernels and plans of its day.
"""

READERS = {"linear": plan_check.layers, "moe": moe_layers, "step": steps}


def merge(saved: list[dict]) -> dict[tuple[str, Group, str, int], Cell]:
    """(device, group, label, M / T / B) -> the cell of the last file that measured it."""
    cells = {}
    for i, s in enumerate(saved):
        if sm12x_roofline.is_cards(s):  # the roofline's inputs: published rates, no measurement
            continue
        kind = kind_of(s["rows"])
        for layer in READERS[kind](s["rows"]):
            key = (s.get("device", "?"), Group(layer.get("kind", kind), layer["model"]), layer["label"], layer["m"])
            cells[key] = Cell(layer["speedup"], layer["us"], i)
    return cells


def tables(cells: dict) -> list[tuple[str, Group]]:
    """(device, group) per table, in order: by device, then linear models, MoE shapes, decode steps, each model's
    serving table (its prefill chunks and batched decode steps) after its decode steps'."""
    order = {name: i for i, name in enumerate(plan_check.MODELS)} | {name: i for i, name in enumerate(moe.SHAPES)}
    keys = {(d, Group("serving", g.name) if g.kind == "prefill" else g) for d, g, _, _ in cells}
    rank = {"serving": KINDS.index("step")}  # beside the decode steps, model by model

    def key(k):
        g = k[1]
        return k[0], rank.get(g.kind, KINDS.index(g.kind)), order.get(g.name, 99), g.name, KINDS.index(g.kind)

    return sorted(keys, key=key)


def grid(cells: dict, device: str, group: Group) -> tuple[list[int], list[str], dict]:
    here = {(label, m): c for (d, g, label, m), c in cells.items() if (d, g) == (device, group)}
    return sorted({m for _, m in here}), sorted({label for label, _ in here}), here


def serving_grid(cells: dict, device: str, model: str) -> tuple[list[tuple[str, int]], list[str], dict]:
    """A serving table's columns ("prefill", T) for each chunk measured, then ("decode", B) for each of
    SERVING_DECODE measured; its rows; {(label, column): cell}."""
    here = {}
    for (d, g, label, m), c in cells.items():
        if d == device and g.name == model and (g.kind == "prefill" or (g.kind == "step" and m in SERVING_DECODE)):
            here[label, ("prefill" if g.kind == "prefill" else "decode", m)] = c
    columns = sorted({column for _, column in here}, key=lambda c: (c[0] == "decode", c[1]))
    return columns, sorted({label for label, _ in here}), here


def tokens_per_s(cell: Cell, tokens: int) -> tuple[float, float]:
    """b12x's and the bf16 model's tokens/s of a step of `tokens` new tokens (the bf16 step is speedup × b12x's)."""
    return tokens / cell.us * 1e6, tokens / (cell.us * cell.speedup) * 1e6


def serving_table(cells: dict, device: str, group: Group, letters: dict) -> list[str]:
    columns, labels, here = serving_grid(cells, device, group.name)
    head = [
        f"{'prefill T' if step == 'prefill' else 'decode B'}={m}: b12x tok/s | bf16 tok/s | × bf16"
        for step, m in columns
    ]
    out = [
        "One sequence's prefill chunk of T tokens (causal attention over the chunk, no earlier context; logits of its",
        "last token) and decode steps of B sequences (one new token each): tokens/s of the model with b12x's linears",
        "and experts, of the bf16 model in the same run, and × the bf16 model's; the letter names the file.",
        "",
        "| format × activations | " + " | ".join(head) + " |",
        "|---|" + "---:|---:|---:|" * len(columns),
    ]
    for label in labels:
        row = []
        for column in columns:
            cell = here.get((label, column))
            if cell is None:
                row += ["—"] * 3
                continue
            b12x, bf16 = tokens_per_s(cell, column[1])
            row += [f"{b12x:,.0f}", f"{bf16:,.0f}", f"{cell.speedup:.2f}<sup>{letters[cell.run]}</sup>"]
        out.append(f"| {label} | " + " | ".join(row) + " |")
    return out


def glance(cells: dict) -> list[str]:
    """One line per device and kind: the range of speed-ups at decode sizes and at prefill sizes (prefill chunks:
    over the chunk lengths measured)."""
    out = []
    what = {"linear": "decoder layers' linears", "moe": "MoE layers", "step": "whole-model decode steps",
            "prefill": "whole-model prefill chunks"}  # fmt: skip
    for device in sorted({d for d, _, _, _ in cells}):
        for kind, small, large in (("linear", 8, 256), ("moe", 8, 256), ("step", 16, 64), ("prefill", None, None)):
            here = [(m, c.speedup) for (d, g, _, m), c in cells.items() if d == device and g.kind == kind]
            if not here:
                continue
            count = Group(kind, "").count
            if small is None:
                ranges = [("/".join(str(m) for m in sorted({m for m, _ in here})), [s for _, s in here])]
            else:
                ranges = [(f"1-{small}", [s for m, s in here if m <= small]),
                          (f"≥ {large}", [s for m, s in here if m >= large])]  # fmt: skip
            parts = [f"{min(v):.2f}-{max(v):.2f}× at {count} {name}" for name, v in ranges if v]
            out.append(f"- {device}, {what[kind]} (× {Group(kind, '').baseline}): " + "; ".join(parts))
    return out


def page(cells: dict, paths: list[str], saved: list[dict]) -> str:
    used = sorted({c.run for c in cells.values()})
    cards = [i for i, s in enumerate(saved) if sm12x_roofline.is_cards(s)]
    model_note = ["The SM12x roofline at the end is a model worked out from published rates, not a measurement."]
    model_note = model_note if cards else []
    letters = dict(zip(used, string.ascii_letters, strict=False))
    devices = sorted({d for d, _, _, _ in cells})
    out = [
        "# Performance",
        "",
        "<!-- Generated by benchmarks/performance_page.py from the files listed at the end; do not edit by hand. -->",
        "",
        "How fast b12x's dispatched ops run against the bf16 baseline on the same GPU, from the newest measurement of",
        "each point. Above 1.00 b12x is faster. Devices measured: " + ", ".join(devices) + ".",
        *model_note,
        "",
        "## At a glance",
        "",
        *glance(cells),
        "",
        METHOD,
    ]
    for device in devices:
        out += [f"## {device}", ""]
        for d, group in tables(cells):
            if d != device:
                continue
            if group.kind == "serving":
                out += [f"### {group.title}", "", *serving_table(cells, device, group, letters)]
                runs = sorted({c.run for c in serving_grid(cells, device, group.name)[2].values()})
                out += ["", "; ".join(f"<sup>{letters[i]}</sup> `{Path(paths[i]).name}`" for i in runs), ""]
                out += [f"![{group.title}](results/{group.plot_name(device)})", ""]
                continue
            counts, labels, here = grid(cells, device, group)
            out += [f"### {group.title}", "", f"× {group.baseline} of the same run; the letter names the file.", ""]
            out.append("| format × activations | " + " | ".join(f"{group.count}={m}" for m in counts) + " |")
            out.append("|---|" + "---:|" * len(counts))
            for label in labels:
                row = [f"{here[(label, m)].speedup:.2f}<sup>{letters[here[(label, m)].run]}</sup>"
                       if (label, m) in here else "—" for m in counts]  # fmt: skip
                out.append(f"| {label} | " + " | ".join(row) + " |")
            runs = sorted({c.run for c in here.values()})
            out += ["", "; ".join(f"<sup>{letters[i]}</sup> `{Path(paths[i]).name}`" for i in runs), ""]
            out += [f"![{group.title}](results/{group.plot_name(device)})", ""]
    for i in cards:
        out += sm12x_roofline.section(saved[i], paths[i])
    out += [
        "## Regenerating this page",
        "",
        "```",
        PAGE_COMMAND,
        "```",
        "",
        "`--plots DIR` redraws the heat maps; without it only the markdown is written. To add a measurement, add its",
        "JSON to docs/results/ and its path at the end of `docs/results/performance_runs.txt`; the command fails on a",
        "listed file that no longer gives a cell, so remove that one. The files read, oldest first:",
        "",
    ]
    for i in used:
        s = saved[i]
        what = {"linear": "plan_check.py", "moe": "moe.py", "step": "model_decode.py"}[kind_of(s["rows"])]
        out.append(f"- <sup>{letters[i]}</sup> [`{Path(paths[i]).name}`](results/{Path(paths[i]).name}): "
                   f"benchmarks/{what}, {s.get('device', '?')}, {s.get('date') or '?'}")  # fmt: skip
    for i in cards:
        name = Path(paths[i]).name
        out.append(f"- [`{name}`](results/{name}): the SM12x cards' published rates, the roofline model's inputs")
    return "\n".join(out) + "\n"


def plot_serving(cells: dict, device: str, group: Group, path: Path) -> None:
    """A serving table drawn: a panel per step, a bar per format × activations of b12x's tokens/s, a black tick at
    the bf16 model's of the same run, the ratio beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns, labels, here = serving_grid(cells, device, group.name)
    fig, axes = plt.subplots(1, len(columns), figsize=(3.6 * len(columns) + 2, 0.4 * len(labels) + 1.8), sharey=True,
                             squeeze=False)  # fmt: skip
    for ax, column in zip(axes[0], columns, strict=True):
        for y, label in enumerate(labels):
            cell = here.get((label, column))
            if cell is None:
                continue
            b12x, bf16 = tokens_per_s(cell, column[1])
            ax.barh(y, b12x, color="tab:green" if cell.speedup >= 1 else "tab:red")
            ax.plot([bf16, bf16], [y - 0.4, y + 0.4], "k-", linewidth=2)
            ax.text(max(b12x, bf16), y, f" {cell.speedup:.2f}×", va="center", fontsize=7)
        ax.set_title(f"{'prefill T' if column[0] == 'prefill' else 'decode B'}={column[1]}", fontsize=9)
        ax.set_xlabel("tokens/s (bar b12x, tick bf16)", fontsize=8)
        ax.margins(x=0.2)
    axes[0][0].set_yticks(range(len(labels)), labels, fontsize=8)
    axes[0][0].invert_yaxis()
    fig.suptitle(f"{device}: {group.title}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot(cells: dict, device: str, group: Group, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    counts, labels, here = grid(cells, device, group)
    values = [[here[(label, m)].speedup if (label, m) in here else float("nan") for m in counts] for label in labels]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(counts) + 3), 0.4 * len(labels) + 1.6))
    image = ax.imshow(values, cmap="RdYlGn", norm=TwoSlopeNorm(vmin=0.3, vcenter=1.0, vmax=4.0), aspect="auto")
    for y, line in enumerate(values):
        for x, value in enumerate(line):
            if value == value:  # not NaN
                ax.text(x, y, f"{value:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(counts)), [str(m) for m in counts])
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel({"M": "M (tokens)", "T": "T (tokens)", "B": "B (sequences)"}[group.count])
    ax.set_title(f"{device}: {group.title.replace('`', '')}\n× {group.baseline.replace('`', '')}", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.03)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 fromfile_prefix_chars="@")  # fmt: skip
    ap.add_argument("runs", nargs="+", help="plan_check.py, moe.py and model_decode.py --out JSON files, oldest first")
    ap.add_argument("--plots", default="", help="also draw one heat map per table into this folder")
    args = ap.parse_args(argv)
    saved = [json.loads(Path(p).read_text()) for p in args.runs]
    cells = merge(saved)
    idle = [p for i, p in enumerate(args.runs)
            if not sm12x_roofline.is_cards(saved[i]) and all(c.run != i for c in cells.values())]  # fmt: skip
    if idle:
        print("these files give no cell (newer files measured all they hold): " + ", ".join(idle), file=sys.stderr)
        return 1
    if len(args.runs) > len(string.ascii_letters):
        ap.error(f"more than {len(string.ascii_letters)} files give cells (a letter each)")
    sys.stdout.write(page(cells, args.runs, saved))
    if args.plots:
        for device, group in tables(cells):
            draw = plot_serving if group.kind == "serving" else plot
            draw(cells, device, group, Path(args.plots) / group.plot_name(device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
