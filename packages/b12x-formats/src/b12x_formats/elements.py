"""Element encodings (E4M3, E2M1, E8M0) on numpy arrays, through ml_dtypes.

ml_dtypes is the reference for element values: decode is a dtype view, encode a cast (round half to even).
E4M3 casts do not saturate, so every encoder clamps to ±448 first.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E8M0_NAN = 0xFF
E8M0_BIAS = 127  # code b means 2^(b - 127)


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """float -> float8_e4m3fn array (the checkpoint dtype), round to nearest even, saturating at ±448."""
    x = np.clip(np.asarray(x, dtype=np.float32), -E4M3_MAX, E4M3_MAX)
    return x.astype(ml_dtypes.float8_e4m3fn)


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """float8_e4m3fn (or its uint8 bit pattern) -> float32."""
    return np.asarray(codes).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def encode_e2m1(x: np.ndarray) -> np.ndarray:
    """float -> 4-bit codes in uint8 (0..15), round half to even, saturating at ±6."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F


def decode_e2m1(codes: np.ndarray) -> np.ndarray:
    return (np.asarray(codes, dtype=np.uint8) & 0x0F).view(ml_dtypes.float4_e2m1fn).astype(np.float32)


def decode_e8m0(codes: np.ndarray) -> np.ndarray:
    """uint8 biased exponents -> float32 2^(b-127); 0xFF decodes to NaN (callers reject it first)."""
    return np.asarray(codes, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)


def e8m0_from_exponent(exponent: np.ndarray) -> np.ndarray:
    """Unbiased integer exponents -> uint8 E8M0 codes, clamped to the finite range 2^-127 .. 2^127."""
    return (np.clip(exponent, -E8M0_BIAS, E8M0_BIAS) + E8M0_BIAS).astype(np.uint8)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """[..., K] 4-bit codes -> [..., K/2] bytes, element 2i in the low nibble, 2i+1 in the high nibble."""
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """Inverse of pack_nibbles: [..., K/2] bytes -> [..., K] codes."""
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out
