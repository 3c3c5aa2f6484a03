"""A linear's output poisoned before a kernel writes it, for the GPU tests of what a kernel writes: NaN everywhere, and
PAST_N columns wider than the kernel's N (its leading dimension past N). An element the kernel leaves unwritten, or
one it writes past its N columns, shows after the launch."""

from __future__ import annotations

import torch

PAST_N = 8  # columns past N: the kernel writes y[:, :N] of a row PAST_N wider


def poisoned_output(m: int, n: int, device) -> torch.Tensor:
    """bf16 [m, n + PAST_N], every element NaN."""
    return torch.full((m, n + PAST_N), float("nan"), dtype=torch.bfloat16, device=device)


def check_its_columns_written(y: torch.Tensor, n: int) -> None:
    """Every element of y's first n columns written, and nothing past them."""
    assert not torch.isnan(y[:, :n]).any() and torch.isnan(y[:, n:]).all()
