"""Array conversion at the package boundary: numpy or torch in, numpy out (torch is never imported here)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

# torch dtypes numpy lacks, mapped to their ml_dtypes twins through a same-width integer view.
_TORCH_VIEWS = {
    "torch.bfloat16": ("int16", ml_dtypes.bfloat16),
    "torch.float8_e4m3fn": ("uint8", ml_dtypes.float8_e4m3fn),
    "torch.float8_e8m0fnu": ("uint8", ml_dtypes.float8_e8m0fnu),
}


def is_torch_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def to_numpy(x) -> np.ndarray:
    """A numpy view or copy of `x`, keeping its dtype (bf16/fp8 torch tensors become ml_dtypes arrays)."""
    if is_torch_tensor(x):
        import torch

        t = x.detach().to("cpu")
        view = _TORCH_VIEWS.get(str(t.dtype))
        if view is None:
            return t.numpy()
        int_dtype, np_dtype = view
        return t.view(getattr(torch, int_dtype)).numpy().view(np_dtype)
    return np.asarray(x)


def to_float32(x, what: str = "w") -> np.ndarray:
    arr = to_numpy(x)
    if not (np.issubdtype(arr.dtype, np.floating) or arr.dtype in (ml_dtypes.bfloat16,)):
        raise ValueError(f"{what}: expected a floating-point array, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def require_finite(what: str, arr: np.ndarray, rule: str, chunk: int = 1 << 24) -> None:
    """ValueError naming `what`, its shape and the first NaN/Inf (value and index) when `arr` holds one.
    Checked in chunks, so a multi-GB tensor needs no mask of its own size."""
    flat = arr.reshape(-1)
    for start in range(0, flat.size, chunk):
        bad = np.flatnonzero(~np.isfinite(flat[start : start + chunk]))
        if bad.size:
            where = np.unravel_index(start + int(bad[0]), arr.shape)
            raise ValueError(f"{what} {list(arr.shape)} holds {arr[where]} at index {[int(i) for i in where]}; {rule}")
