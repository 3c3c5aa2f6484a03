"""The GPU kernels' tolerance against the b12x-core reference (both sum in fp32, in different orders, and
round to bf16): |y − y_ref| ≤ 1e-2 · max(|y_ref|, rms(y_ref)) + 2^-7·|y_ref| (one bf16 ulp) + slack, and no NaN.
`slack` (per element) is what a caller can bound beyond that, e.g. quantizer flips of a computed intermediate."""

from __future__ import annotations

import torch


def close(y: torch.Tensor, ref: torch.Tensor, slack: torch.Tensor | float = 0.0) -> None:
    y, ref = y.float().cpu(), ref.float().cpu()
    assert not torch.isnan(y).any()
    scale = torch.maximum(ref.abs(), ref.square().mean().sqrt())
    ulp = 2**-7 * ref.abs()  # one ulp of the reference apart where a sum sits on a rounding boundary
    assert ((y - ref).abs() <= 1e-2 * scale + ulp + slack).all(), ((y - ref).abs() / scale).max()
