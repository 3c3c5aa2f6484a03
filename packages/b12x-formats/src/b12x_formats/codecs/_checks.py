"""Value checks shared by the codecs: each raises ValueError naming the tensor, the offending index and the rule."""

from __future__ import annotations

import numpy as np


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def require_finite(fmt: str, name: str, values: np.ndarray, *, positive: bool = False) -> None:
    values = np.asarray(values, dtype=np.float32)
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(
            f"{fmt}: tensor '{name}' {tuple(values.shape)} holds a non-finite value "
            f"({values[_first(bad)]} at index {_first(bad)}); scales must be finite"
        )
    if positive and (values < 0).any():
        bad = values < 0
        raise ValueError(
            f"{fmt}: tensor '{name}' {tuple(values.shape)} holds a negative scale "
            f"({values[_first(bad)]} at index {_first(bad)}); scales must be >= 0"
        )


def reject_e4m3_nan(fmt: str, name: str, codes: np.ndarray) -> None:
    """E4M3 has no Inf; 0x7F / 0xFF are NaN."""
    codes = np.asarray(codes).view(np.uint8)
    bad = (codes & 0x7F) == 0x7F
    if bad.any():
        raise ValueError(
            f"{fmt}: tensor '{name}' {tuple(codes.shape)} holds an E4M3 NaN code "
            f"(0x{int(codes[_first(bad)]):02X} at index {_first(bad)})"
        )


def reject_e8m0_nan(fmt: str, name: str, codes: np.ndarray) -> None:
    """E8M0 0xFF is NaN: reject it at load rather than clamp it."""
    bad = np.asarray(codes) == 0xFF
    if bad.any():
        raise ValueError(
            f"{fmt}: tensor '{name}' {tuple(np.shape(codes))} holds the E8M0 NaN code 0xFF at index "
            f"{_first(bad)}; scales must be finite powers of two"
        )
