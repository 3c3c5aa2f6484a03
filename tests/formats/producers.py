"""Independent re-implementations of the producers' quantization rules (FORMATS.md), for tests only.

Element rounding here is written out (nearest value, ties to the even code) or done by torch's own fp8 cast,
never through b12x_formats or its ml_dtypes calls.
"""

from __future__ import annotations

import numpy as np

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)


def e2m1_codes(x: np.ndarray) -> np.ndarray:
    """Round to the nearest E2M1 value, ties to the even code, saturating at 6; returns 4-bit codes."""
    a = np.minimum(np.abs(x.astype(np.float64)), 6.0)
    dist = np.abs(a[..., None] - E2M1)
    best = dist.min(axis=-1, keepdims=True)
    tied = dist == best
    # among tied candidates prefer the even code
    even = tied & (np.arange(8) % 2 == 0)
    code = np.where(even.any(axis=-1), even.argmax(axis=-1), tied.argmax(axis=-1)).astype(np.uint8)
    return code | (np.signbit(x).astype(np.uint8) << 3)  # negatives that round to zero keep their sign (-0)


def pack(codes: np.ndarray) -> np.ndarray:
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def torch_e4m3_bytes(x: np.ndarray) -> np.ndarray:
    import torch

    t = torch.from_numpy(np.clip(x, -448, 448).astype(np.float32)).to(torch.float8_e4m3fn)
    return t.view(torch.uint8).numpy()


def smallest_pow2_exponent_at_least(x: float) -> int:
    e = -127
    while 2.0**e < x:
        e += 1
    return e


def floor_log2(x: float) -> int:
    e = 127
    while 2.0**e > x:
        e -= 1
    return e
