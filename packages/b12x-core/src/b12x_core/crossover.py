"""When a linear leaves its GEMV for the Triton tiles, and the tiles for decode + dense bf16 GEMM: the smallest
M of each, per GPU and format.

Measured with `benchmarks/decode_linear.py --crossover` (both paths over M = 1..64 on 28672×8192, 8192×28672,
4096×14336; the first M from which the tiles are never slower) and committed here; an unmeasured GPU gets
DEFAULT: the GEMV runs up to 16 tokens per launch, so beyond that the tiles always win.
"""

from __future__ import annotations

import torch

DEFAULT = 17
DEFAULT_GEMM = 256
MEASURED: dict[tuple[int, int], dict[str, int]] = {}
MEASURED_GEMM: dict[tuple[int, int], dict[str, int]] = {}


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)


def tiles_from(fmt: str, device: torch.device) -> int:
    return MEASURED.get(_capability(device), {}).get(fmt, DEFAULT)


def gemm_from(fmt: str, device: torch.device) -> int:
    return MEASURED_GEMM.get(_capability(device), {}).get(fmt, DEFAULT_GEMM)
