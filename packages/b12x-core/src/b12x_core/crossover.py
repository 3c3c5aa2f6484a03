"""When a linear leaves its GEMV for the Triton tiles, and the tiles for decode + dense bf16 GEMM: the smallest
M of each, per GPU and format.

Measured with `benchmarks/prefill_linear.py` (each path alone over M on 8192×8192: the first M from which the
next path is never slower) and committed here; an unmeasured GPU gets DEFAULT (the GEMV runs up to 16 tokens
per launch) and DEFAULT_GEMM.
"""

from __future__ import annotations

import torch

DEFAULT = 17
DEFAULT_GEMM = 256
# H200, 2026-11-30, 8192×8192 (docs/performance.md): GEMV 85–128 µs at M=8 and 173–218 µs at M=16; decode +
# GEMM 109–137 µs from M=32 down; the tiles 212–497 µs at M ≤ 64 (one wave of 64 column tiles, no split-K).
# So bf16 activations skip the tiles: GEMV below 12 tokens, decode + dense GEMM from 12.
_H200 = dict.fromkeys(("FP8", "FP8_BLOCK", "MXFP8", "NVFP4", "W4A16_NVFP4", "MXFP4", "Q8_0", "IQ2_XXS", "IQ2_XS"), 12)
MEASURED: dict[tuple[int, int], dict[str, int]] = {(9, 0): _H200}
MEASURED_GEMM: dict[tuple[int, int], dict[str, int]] = {(9, 0): _H200}


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)


def tiles_from(fmt: str, device: torch.device) -> int:
    return MEASURED.get(_capability(device), {}).get(fmt, DEFAULT)


def gemm_from(fmt: str, device: torch.device) -> int:
    return MEASURED_GEMM.get(_capability(device), {}).get(fmt, DEFAULT_GEMM)
