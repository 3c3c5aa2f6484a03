"""b12x device code: CUDA C++ kernels behind a narrow pointer-based binding (`b12x_kernels._C`).

Imports on machines without a GPU (or without the built extension: an install without a CUDA compiler has
only the Triton kernels): `available()` says whether kernels can run here, `unavailable_reason()` why not and
`not_built_reason()` whether the extension is missing and how to get it. No dispatch policy lives here:
b12x_core decides what runs.
"""

from __future__ import annotations

__version__ = "0.1.0"

GGML_FORMAT_IDS = {"Q8_0": 0, "IQ2_XXS": 1, "IQ2_XS": 2}
ELEM_FORMAT_IDS = {"FP8": 0, "FP8_BLOCK": 1, "MXFP8": 2, "NVFP4": 3, "W4A16_NVFP4": 3, "MXFP4": 4}

HOW_TO_BUILD = (
    "install b12x-kernels where nvcc is found (CUDACXX, PATH or /usr/local/cuda): "
    "pip install --force-reinstall --no-deps packages/b12x-kernels from the b12x repository, "
    "or its Linux x86_64 wheel"
)

try:
    from . import _C
except ImportError as err:  # built without CUDA, or not built
    _C = None
    _IMPORT_ERROR = str(err)
else:
    _IMPORT_ERROR = ""


def not_built_reason() -> str:
    """Why this install has no CUDA extension ('' when it has one): the build's own record, else the import error."""
    if _C is not None:
        return ""
    try:
        from ._build_info import NO_CUDA_REASON
    except ImportError:  # a source tree that was never built
        NO_CUDA_REASON = ""
    return f"the CUDA kernels are not built: {NO_CUDA_REASON or _IMPORT_ERROR}; to get them, {HOW_TO_BUILD}"


def unavailable_reason() -> str:
    """Why kernels cannot run here, or '' when they can."""
    if _C is None:
        return not_built_reason()
    count, error = _C.device_count()
    return "" if count > 0 else f"no CUDA device ({error})"


def available() -> bool:
    return unavailable_reason() == ""


def compiled_archs() -> list[str]:
    return [] if _C is None else _C.compiled_archs().split(",")


def gemv_ggml(fmt: str, w: int, grid: int, x: int, bias: int, y: int, m: int, n: int, k: int, stream: int) -> None:
    """y[m, n] = x @ W.T (+ bias) for M <= 16, W raw GGML blocks; all arguments are device pointers / sizes."""
    _C.gemv_ggml(GGML_FORMAT_IDS[fmt], w, grid, x, bias, y, m, n, k, stream)


def gemv_elem(
    fmt: str,
    w: int,
    scales: int,
    tensor_scale: float,
    x: int,
    bias: int,
    y: int,
    ldy: int,
    m: int,
    n: int,
    k: int,
    stream: int,
) -> None:
    """y[m, :n] (row stride ldy) = x @ W.T * tensor_scale (+ bias) for FP8 / FP8_BLOCK / MXFP8 / NVFP4 / MXFP4."""
    _C.gemv_elem(ELEM_FORMAT_IDS[fmt], w, scales, tensor_scale, x, bias, y, ldy, m, n, k, stream)


def embedding_q8_0(table: int, ids: int, ids_int64: bool, out: int, t: int, v: int, h: int, stream: int) -> None:
    _C.embedding_q8_0(table, ids, ids_int64, out, t, v, h, stream)
