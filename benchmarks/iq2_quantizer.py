"""IQ2 quantizer: reconstruction error and CPU time, optionally beside llama.cpp's own quantizer.

    python benchmarks/iq2_quantizer.py                       # ours: 4096x4096 Gaussian, IQ2_XXS and IQ2_XS
    python benchmarks/iq2_quantizer.py --libggml PATH/libggml-base.so --rows 512
                                                             # plus llama.cpp's ggml_quantize_chunk (all-ones imatrix)

Error is relative MSE, sum((w - w')^2) / sum(w^2), decoded with gguf.quants (the independent decoder).
This is a CPU benchmark of offline quantization; device kernels are measured elsewhere in benchmarks/.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import time

import gguf
import numpy as np

import b12x_formats as bf


def rel_mse(w: np.ndarray, blocks: np.ndarray, fmt: str) -> float:
    back = gguf.quants.dequantize(blocks.reshape(w.shape[0], -1), gguf.GGMLQuantizationType[fmt]).reshape(w.shape)
    return float(np.sum((w - back) ** 2) / np.sum(w**2))


def llama_cpp_quantize(lib: ctypes.CDLL, w: np.ndarray, fmt: str, importance: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's own quantizer; `importance` [K] (an imatrix row) or all ones, which llama.cpp needs for IQ2."""
    qtype = int(gguf.GGMLQuantizationType[fmt])
    w = np.ascontiguousarray(w, np.float32)
    n, k = w.shape
    group, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt]]
    out = np.zeros((n, k // group * nbytes), np.uint8)
    ones = np.ascontiguousarray(np.ones(k, np.float32) if importance is None else importance, np.float32)
    lib.ggml_quantize_init(qtype)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk(
        ctypes.c_int(qtype), w.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_int64(0), ctypes.c_int64(n), ctypes.c_int64(k), ones.ctypes.data_as(ctypes.c_void_p),
    )  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--libggml", help="path to llama.cpp's libggml-base shared library, to compare against")
    args = parser.parse_args()
    lib = ctypes.CDLL(args.libggml) if args.libggml else None
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {args.rows}x{args.cols} Gaussian")
    header = f"{'format':<8} {'seed':>4} {'b12x rel MSE':>13} {'b12x s':>7}"
    print(header + (f" {'llama.cpp rel MSE':>18} {'llama.cpp s':>12} {'ratio':>6}" if lib else ""))
    for fmt in ("IQ2_XXS", "IQ2_XS"):
        for seed in range(args.seeds):
            w = np.random.default_rng(seed).standard_normal((args.rows, args.cols)).astype(np.float32)
            t0 = time.perf_counter()
            ours = bf.quantize(w, fmt).tensors["weight"]
            t_ours = time.perf_counter() - t0
            err = rel_mse(w, ours, fmt)
            line = f"{fmt:<8} {seed:>4} {err:>13.5f} {t_ours:>7.1f}"
            if lib is not None:
                t0 = time.perf_counter()
                theirs = llama_cpp_quantize(lib, w, fmt)
                t_theirs = time.perf_counter() - t0
                ref = rel_mse(w, theirs, fmt)
                line += f" {ref:>18.5f} {t_theirs:>12.1f} {err / ref:>6.3f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
