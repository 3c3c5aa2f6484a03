"""Independent element-level decoders for the non-GGML formats, written from FORMATS.md with ml_dtypes.

They decode one scale group at a time with explicit loops over groups, sharing no code with b12x_formats.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np


def e4m3(codes):
    return np.asarray(codes).view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def e8m0(codes):
    return np.asarray(codes, np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)


def fp4_elements(packed):
    """[..., K/2] bytes -> [..., K] float32, element 2i in the low nibble."""
    lo = (packed & 0x0F).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    hi = (packed >> 4).astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    return np.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _per_group(values, scales, group):
    out = np.empty_like(values)
    for g in range(scales.shape[-1]):
        sl = slice(g * group, (g + 1) * group)
        out[..., sl] = values[..., sl] * scales[..., g : g + 1]
    return out


def decode(fmt: str, t: dict) -> np.ndarray:
    if fmt == "FP8":
        s = (
            np.float32(np.asarray(t["weight_scale"], np.float32).reshape(-1)[0])
            if np.size(t["weight_scale"]) == 1
            else None
        )
        q = e4m3(t["weight"])
        if s is not None:
            return q * s
        return q * np.asarray(t["weight_scale"], np.float32)[..., None, None]
    if fmt == "FP8_BLOCK":
        q = e4m3(t["weight"])
        s = np.asarray(t["weight_scale_inv"], np.float32)
        out = np.empty_like(q)
        for i in range(s.shape[-2]):
            for j in range(s.shape[-1]):
                blk = (..., slice(128 * i, 128 * i + 128), slice(128 * j, 128 * j + 128))
                out[blk] = q[blk] * s[..., i : i + 1, j : j + 1]
        return out
    if fmt == "MXFP8":
        return _per_group(e4m3(t["weight"]), e8m0(t["weight_scale"]), 32)
    if fmt == "MXFP4":
        return _per_group(fp4_elements(t["weight"]), e8m0(t["weight_scale"]), 32)
    if fmt in ("NVFP4", "W4A16_NVFP4"):
        blockwise = _per_group(fp4_elements(t["weight"]), e4m3(t["weight_scale"]), 16)
        g = np.asarray(t["weight_scale_2"], np.float32)
        g = g.reshape(()) if g.size == 1 else g[..., None, None]
        return blockwise * g
    raise KeyError(fmt)
