"""Perplexity of a checkpoint through vLLM with the b12x backends, optionally beside a second checkpoint, so a
format mix can be chosen by what it costs in quality.

    python -m b12x_vllm.eval MODEL_DIR [--compare MODEL_DIR2] [--text FILE] [--log FILE]
    b12x-eval MODEL_DIR ...                                   (the same, as a console script)

Each checkpoint runs in a vLLM process of its own (engine.py); vLLM's log goes to --log, by default beside
MODEL_DIR (`MODEL_DIR.vllm.log`), never into the current directory. Without --text the paragraph shipped with
b12x-vllm (b12x_vllm/data/paragraph.txt) is scored. Perplexity is exp(mean negative log-likelihood) of every token
after the first; the token count says how many were scored. With --compare, MODEL_DIR is the model being judged and
MODEL_DIR2 its reference: MODEL_DIR's line carries the ratio of its perplexity over the reference's (×1.10: 10%
worse), as the demo's does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARAGRAPH = Path(__file__).with_name("data") / "paragraph.txt"


class EngineError(RuntimeError):
    pass


def run_model(
    model: Path, log: Path, text: Path | None = None, chat: str | None = None, speed_runs: int = 0, desc: str = ""
) -> dict:
    """Run `model` in `python -m b12x_vllm.engine`, its output appended to `log`, showing elapsed time while it
    runs; returns the engine's result (engine.py). Raises EngineError naming the log when vLLM fails."""
    from tqdm.auto import tqdm

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "b12x_vllm.engine", str(model), str(out)]
        cmd += ["--text", str(text)] if text else []
        cmd += ["--chat", chat] if chat else []
        cmd += ["--speed-runs", str(speed_runs)] if speed_runs else []
        log.parent.mkdir(parents=True, exist_ok=True)
        # elapsed time while vLLM starts and runs (not on a non-terminal: disable=None)
        bar = tqdm(desc=desc or f"vLLM: {model}", bar_format="{desc} {elapsed}", leave=False, disable=None)
        with open(log, "a") as f, bar:
            f.write(f"\n==== {' '.join(cmd)}\n")
            f.flush()
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                time.sleep(1)
                bar.refresh()
        if proc.returncode != 0 or not out.exists():
            raise EngineError(f"vLLM failed on {model} (exit {proc.returncode}); its output is in {log}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="b12x-eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("model", type=Path, metavar="MODEL_DIR", help="a checkpoint directory vLLM can load")
    parser.add_argument("--compare", type=Path, metavar="MODEL_DIR2", help="its reference, scored beside it")
    parser.add_argument("--text", type=Path, default=PARAGRAPH, help="the text to score (default: %(default)s)")
    parser.add_argument("--log", type=Path, help="vLLM's own output (default: MODEL_DIR.vllm.log beside MODEL_DIR)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    models = [args.model] + ([args.compare] if args.compare else [])
    for path in [*models, args.text]:
        if not path.exists():
            print(f"b12x-eval: error: {path} does not exist", file=sys.stderr)
            return 2
    log = args.log or default_log(args.model)
    results = []
    try:
        for model in models:
            results.append(run_model(model, log, text=args.text, desc=f"vLLM: scoring {model}"))
    except EngineError as err:
        print(f"b12x-eval: error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{k: r[k] for k in ("model", "perplexity", "tokens", "quantization")} for r in results]))
        return 0
    print(render(results, args.text))
    print(f"(vLLM's log: {log})")
    return 0


def default_log(model: Path) -> Path:
    """MODEL_DIR.vllm.log beside the checkpoint scored."""
    model = model.resolve()
    return model.with_name(f"{model.name}.vllm.log")


def render(results: list[dict], text: Path) -> str:
    """A line per checkpoint; with two, the first (the model judged) carries its perplexity over the second's."""
    width = max(len(r["model"]) for r in results)
    lines = [f"perplexity on {text} ({results[0]['tokens']} tokens scored)",
             f"{'model':<{width}}  {'quantization':<12}  {'tokens':>6}  {'perplexity':>10}"]  # fmt: skip
    for i, r in enumerate(results):
        ratio = f"  ×{r['perplexity'] / results[1]['perplexity']:.3f}" if i == 0 and len(results) > 1 else ""
        quant = r["quantization"] or "none"
        lines.append(f"{r['model']:<{width}}  {quant:<12}  {r['tokens']:>6}  {r['perplexity']:>10.3f}{ratio}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
