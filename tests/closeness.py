"""The GPU kernels' tolerance against the b12x-core reference (both sum in fp32, in different orders, and
round to bf16): |y − y_ref| ≤ 1e-2 · max(|y_ref|, rms(y_ref)) + 2^-7·|y_ref| (one bf16 ulp) + slack, and no NaN.
`slack` (per element) is what a caller can bound beyond that, e.g. quantizer flips of a computed intermediate, or
rounding_slack: the tensor-core kernels round Q8_0's q·d and IQ2's grid·sign·scale products once to bf16 (2^-9 of
the weight at most, mma_gemm.cuh), which a sum of few large weights can carry past 1% of its row's rms."""

from __future__ import annotations

import torch


def close(y: torch.Tensor, ref: torch.Tensor, slack: torch.Tensor | float = 0.0) -> None:
    y, ref = y.float().cpu(), ref.float().cpu()
    assert not torch.isnan(y).any()
    scale = torch.maximum(ref.abs(), ref.square().mean().sqrt())
    ulp = 2**-7 * ref.abs()  # one ulp of the reference apart where a sum sits on a rounding boundary
    assert ((y - ref).abs() <= 1e-2 * scale + ulp + slack).all(), ((y - ref).abs() / scale).max()


ROUNDED_DECODES = ("Q8_0", "IQ2_XXS", "IQ2_XS")  # formats whose decode rounds each weight once to bf16


def rounding_slack(fmt: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | float:
    """For y = x @ w.T: the most one bf16 rounding of each weight (|Δw| ≤ 2^-9·|w|) can move each output, for the
    formats whose decode rounds (0 for the others, whose decodes are exact)."""
    if fmt not in ROUNDED_DECODES:
        return 0.0
    return (2.0**-9 * (x.double().cpu().abs() @ w.double().cpu().abs().T)).float()
