"""IQ2_XS quantization speed (weights/s) of `b12x-formats quantize --jobs N`, beside llama.cpp's quantizer.

    python benchmarks/iq2_speed.py [--layers 8 --rows 1024 --cols 4096] [--libggml PATH/libggml-base.so]

b12x: a random bf16 checkpoint of `--layers` linear layers goes through `quantize_checkpoint` (read, quantize,
write: the whole command) with 1 job and with every core. llama.cpp: the same matrices through
`ggml_quantize_chunk`, 1 thread and every core, rows split between threads as llama-quantize splits them
(ctypes releases the GIL during the call). Weights/s counts quantized weights over wall-clock seconds.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
from iq2_quantizer import llama_cpp_quantize

from b12x_formats.checkpoint import save_checkpoint
from b12x_formats.hf_quantize import QuantizePlan, quantize_checkpoint
from b12x_formats.parallel import default_jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--libggml", help="llama.cpp's libggml-base shared library, for the llama.cpp rows")
    args = parser.parse_args()
    cores = default_jobs()
    rng = np.random.default_rng(0)
    shape = (args.rows, args.cols)
    weights = {
        f"model.layers.{i}.mlp.down_proj.weight": (rng.standard_normal(shape) / 64).astype(ml_dtypes.bfloat16)
        for i in range(args.layers)
    }
    total = args.layers * args.rows * args.cols
    print(f"# {args.layers} x {args.rows}x{args.cols} = {total / 1e6:.1f} M weights, {cores} cores, IQ2_XS")
    print("| quantizer | workers | seconds | M weights/s |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "hf"
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": args.layers}
        save_checkpoint(src, weights.items(), config, total=len(weights))
        for jobs in sorted({1, cores}):
            t0 = time.perf_counter()
            quantize_checkpoint(src, Path(tmp) / f"q{jobs}", QuantizePlan("IQ2_XS"), jobs=jobs)
            seconds = time.perf_counter() - t0
            print(f"| b12x-formats quantize --jobs {jobs} | {jobs} | {seconds:.1f} | {total / seconds / 1e6:.2f} |")
    if args.libggml:
        lib = ctypes.CDLL(args.libggml)
        mats = [w.astype(np.float32) for w in weights.values()]
        for threads in sorted({1, cores}):
            t0 = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                for w in mats:
                    parts = np.array_split(w, threads)  # each thread a run of whole rows, as llama-quantize does
                    list(pool.map(lambda part: llama_cpp_quantize(lib, part, "IQ2_XS"), parts))
            seconds = time.perf_counter() - t0
            print(f"| llama.cpp ggml_quantize_chunk | {threads} | {seconds:.1f} | {total / seconds / 1e6:.2f} |")
    print(f"(load average during the run: {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
