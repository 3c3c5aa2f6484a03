"""`nox -s demo`: build a tiny mixed-precision checkpoint (or take --model), run it in vLLM with the b12x
backends, print the generated text, tokens per second and which b12x path ran for each layer type.

    python -m b12x_vllm.demo [--model PATH] [--out out/demo] [--prompt TEXT] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

# The engine runs in this process, so the per-layer report below sees every prepared layer.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEMO_LAYERS = {  # one tiny Llama, every weight format b12x runs with bf16 activations or its own recipe
    "model.layers.0.self_attn.[qkv]_proj": "MXFP4",
    "model.layers.1.self_attn.[qkv]_proj": "FP8",
    "model.layers.0.self_attn.o_proj": "NVFP4",
    "model.layers.1.self_attn.o_proj": "Q8_0",
    "model.layers.0.mlp.down_proj": "Q8_0",
    "model.layers.1.mlp.*": "IQ2_XXS",
    "model.embed_tokens": "Q8_0",
    "lm_head": "Q8_0",
}


def build_checkpoint(out: Path) -> Path:
    from b12x_formats.example import write_example
    from b12x_formats.hf_quantize import QuantizePlan, quantize_checkpoint
    from b12x_formats.inspect import inspect_path, render

    write_example(out / "hf", overwrite=True)
    plan = QuantizePlan("IQ2_XS", list(DEMO_LAYERS.items()))
    model = quantize_checkpoint(out / "hf", out / "b12x", plan, overwrite=True)
    print(render(inspect_path(model)).split("\n\n")[-1])  # the per-format totals
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a ModelOpt checkpoint directory (default: build the tiny one)")
    parser.add_argument("--out", type=Path, default=Path("out/demo"))
    parser.add_argument("--prompt", default="the quick brown fox")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args(argv)

    model = args.model or build_checkpoint(args.out)
    from vllm import LLM, SamplingParams

    from . import report

    llm = LLM(
        model=str(model), linear_backend="b12x", moe_backend="b12x", enforce_eager=True, max_model_len=256,
        max_num_seqs=4, dtype="bfloat16",
    )  # fmt: skip
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate([args.prompt], params)[0].outputs[0]
    seconds = time.perf_counter() - start
    print(f"\nprompt:    {args.prompt!r}\ngenerated: {out.text!r}")
    print(f"{len(out.token_ids)} tokens in {seconds:.2f} s = {len(out.token_ids) / seconds:.1f} tokens/s")
    print(f"quantization method: {llm.llm_engine.vllm_config.model_config.quantization}")
    print("b12x paths (layers):")
    for path, count in report.summary().items():
        print(f"  {count:4d}  {path}")


if __name__ == "__main__":
    main()
