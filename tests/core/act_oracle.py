"""Independent numpy/ml_dtypes versions of the activation-quantization contract (b12x_core/activations.py),
returning float64 x̂. Written from the rules, one group at a time, sharing no code with b12x_core."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np


def e4m3(v):
    return np.clip(np.asarray(v, np.float32), -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def e2m1(v):
    return np.asarray(v, np.float32).astype(ml_dtypes.float4_e2m1fn).astype(np.float64)


def _scale(amax):
    return np.float32(amax) / np.float32(448) if amax > 0 else np.float32(1)


def quantize(x: np.ndarray, mode: str, input_scale: float | None = None) -> np.ndarray:
    x = np.asarray(x, np.float32)
    t, k = x.shape
    out = np.empty((t, k), np.float64)
    if mode == "bf16":
        return x.astype(np.float64)
    if mode == "fp8_static":
        s = np.float32(input_scale)
        return e4m3(x / s) * s
    groups = {"fp8_token": k, "fp8_group128": 128, "mxfp8": 32, "nvfp4": 16}[mode]
    for row in range(t):
        for g0 in range(0, k, groups):
            v = x[row, g0 : g0 + groups]
            amax = float(np.abs(v).max())
            if mode in ("fp8_token", "fp8_group128"):
                s = _scale(amax)
                out[row, g0 : g0 + groups] = e4m3(v / s) * s
            elif mode == "mxfp8":
                exp = (math.frexp(amax)[1] - 1 - 8) if amax > 0 else -127
                exp = min(max(exp, -127), 127)
                out[row, g0 : g0 + groups] = e4m3(v / np.float32(2.0**exp)) * 2.0**exp
            else:  # nvfp4
                g = np.float32(1) / np.float32(input_scale)
                sf = np.float32(e4m3(np.float32(amax) / np.float32(6) * g))
                inv = g / sf if sf > 0 else np.float32(0)
                out[row, g0 : g0 + groups] = e2m1(v * inv) * np.float64(sf) * np.float64(np.float32(input_scale))
    return out
