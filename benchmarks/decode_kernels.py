"""Where one decode step's time goes, kernel by kernel (the fixed costs around each linear):

    python benchmarks/decode_kernels.py --out decode_kernels.json [--model llama8b] [--formats bf16,NVFP4,IQ2_XS,FP8]
        [--batch 1] [--layers 4] [--steps 5]
    python benchmarks/decode_kernels.py --from-json decode_kernels.json          # the table of a saved run, no GPU

model_decode.py's model (its `--layers` decoder layers, random weights), one format at a time: the step is timed as a
CUDA-graph replay (as model_decode.py does), then `--steps` eager steps run under torch.profiler, and every GPU kernel
is attributed to the step. Reported per decoder layer: the kernels (count and summed µs by name, in launch order of
first appearance), their total, and the graph step's µs per layer; the difference is the time between kernels (launch
gaps, a kernel's ramp that another does not overlap). The eager steps' kernel durations are the graph's kernels'
(the same launches); the embedding / final norm / LM head are counted once per step and left out of the per-layer
rows (measured alone with no layers, as model_decode does).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch
from decode_linear import device_facts, reuse_repacks, time_graph
from model_decode import ARCHS, Model


def kernel_times(model: Model, ids: torch.Tensor, steps: int) -> dict[str, tuple[int, float]]:
    """{kernel name: (launches per step, µs per step)} over `steps` eager steps under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(3):
            model(ids)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                model(ids)
            torch.cuda.synchronize()
    seen: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:  # a kernel (or copy) on the GPU's timeline
            seen[event.name].append(event.time_range.elapsed_us())
    return {name: (len(ts) / steps, sum(ts) / steps) for name, ts in seen.items()}


def measure(arch, fmt: str, batch: int, steps: int, replays: int) -> dict:
    model = Model(arch, fmt, max_tokens=max(16, batch))
    ids = torch.randint(model.embed.num_embeddings, (batch,), device="cuda")
    with torch.no_grad():
        step = time_graph(lambda i: model(ids), 1, replays)
    return {"step_us": step, "kernels": kernel_times(model, ids, steps)}  # the model is freed on return


def per_layer(row: dict, head: dict, layers: int) -> tuple[list[tuple[str, float, float]], float, float]:
    """The row's kernels less the no-layer model's, per layer: [(name, launches, µs)], kernel µs, graph µs."""
    out = []
    for name, (n, us) in row["kernels"].items():
        hn, hus = head["kernels"].get(name, (0, 0.0))
        if n - hn > 0:
            out.append((name, (n - hn) / layers, (us - hus) / layers))
    total = sum(us for _, _, us in out)
    return out, total, (row["step_us"] - head["step_us"]) / layers


def table(saved: dict) -> str:
    lines = []
    head = saved["head"]
    for fmt, row in saved["formats"].items():
        kernels, total, graph = per_layer(row, head, saved["layers"])
        lines.append(f"### {saved['model']} {fmt}, batch {saved['batch']}: graph {graph:.1f} µs/layer, kernels "
                     f"{total:.1f} µs/layer ({sum(n for _, n, _ in kernels):.0f} launches), between them "
                     f"{graph - total:.1f} µs")  # fmt: skip
        lines += ["", "| kernel | launches/layer | µs/layer |", "|---|---:|---:|"]
        for name, n, us in sorted(kernels, key=lambda k: -k[2]):
            lines.append(f"| `{name[:110]}` | {n:.2f} | {us:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama8b", choices=sorted(ARCHS))
    parser.add_argument("--formats", default="bf16,NVFP4,IQ2_XS,FP8")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--out", default="decode_kernels.json")
    parser.add_argument("--from-json", default="")
    args = parser.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
    else:
        reuse_repacks()
        started = time.monotonic()
        arch = replace(ARCHS[args.model], layers=args.layers)
        saved = {**device_facts(), "model": args.model, "batch": args.batch, "layers": args.layers, "formats": {}}
        saved["head"] = measure(replace(arch, layers=0), "bf16", args.batch, args.steps, args.replays)
        for fmt in args.formats.split(","):
            saved["formats"][fmt] = measure(arch, fmt, args.batch, args.steps, args.replays)
            torch.cuda.empty_cache()
            Path(args.out).write_text(json.dumps(saved, indent=1))
        print(f"# measured in {time.monotonic() - started:.0f} s", flush=True)
    print(table(saved))


if __name__ == "__main__":
    main()
