"""b12x device code: CUDA C++ kernels behind a narrow pointer-based binding (`b12x_kernels._C`).

Imports on machines without a GPU (or without the built extension: an install without a CUDA compiler has
only the Triton kernels): `available()` says whether kernels can run here, `unavailable_reason()` why not and
`not_built_reason()` whether the extension is missing and how to get it. No dispatch policy lives here:
b12x_core decides what runs and with which configuration (the GEMVs' `max_m` accumulator bucket, the Triton
tiles' block sizes, the tensor-core GEMM's token tile and K splits). Format numbers come from b12x_formats.
"""

from __future__ import annotations

from b12x_formats.kernel_facts import format_id

__version__ = "0.1.0"

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


def gemv_ggml(
    fmt: str, w: int, grid: int, x: int, bias: int, y: int, m: int, max_m: int, n: int, k: int, stream: int
) -> None:
    """y[m, n] = x @ W.T (+ bias) for m <= max_m (1, 2, 4, 8 or 16), W raw GGML blocks; all arguments are device
    pointers / sizes."""
    _C.gemv_ggml(format_id(fmt), w, grid, x, bias, y, m, max_m, n, k, stream)


def gemv_elem(
    fmt: str,
    w: int,
    scales: int,
    tensor_scale: float,
    x: int,
    x_scale: int,
    x_scale_cols: int,
    bias: int,
    y: int,
    ldy: int,
    m: int,
    max_m: int,
    n: int,
    k: int,
    stream: int,
) -> None:
    """y[m, :n] (row stride ldy) = (x · x_scale) @ W.T * tensor_scale (+ bias) for FP8 / FP8_BLOCK / MXFP8 /
    NVFP4 / MXFP4, m <= max_m (1, 2, 4, 8 or 16). x_scale (0: none) is float32 [m, x_scale_cols], one scale per
    token (x_scale_cols 1) or per token and 128 columns (x_scale_cols ceil(k/128))."""
    _C.gemv_elem(format_id(fmt), w, scales, tensor_scale, x, x_scale, x_scale_cols, bias, y, ldy, m, max_m, n, k,
                 stream)  # fmt: skip


def mma_blocks_per_sm(fmt_id: int, mt: int, rt: int) -> int:
    """How many CTAs of the tensor-core GEMM (format id, token tile, row tiles per warp) one SM of the current
    device holds."""
    return _C.mma_blocks_per_sm(fmt_id, mt, rt)


def mma_gemm(
    fmt_id: int,
    codes: int,
    meta: int,
    meta2: int,
    block_scale: int,
    tables: int,
    alpha: float,
    scale_mul: float,
    x: int,
    bias: int,
    y: int,
    ldy: int,
    m: int,
    n: int,
    k: int,
    chunks: int,
    mt: int,
    rt: int,
    splits: int,
    partials: int,
    tickets: int,
    stream: int,
    *,
    epilogue: str = "bf16",
    row_scale: int = 0,
    order: int = 0,
    block_expert: int = 0,
    block_start: int = 0,
    block_rows: int = 0,
    blocks: int = 0,
    top_k: int = 0,
) -> None:
    """Tensor-core mixed-input GEMM over a weight in b12x_core.tensor_core.layout's layout: y[m, :n] (row stride ldy)
    = alpha * x @ W.T (+ bias). `mt` (token tile of 8·mt), `rt` (row tiles of 16 per warp) and `splits` (K
    splits) are the caller's choice.

    `epilogue`: "bf16" (the above), "silu" (rows interleaved 8 gate / 8 up per 16: y gets silu(gate)·up, n/2
    columns), "relu2" (max(v, 0)²) or "f32" (each K split writes fp32 partials[split, m, n], no reduction).
    `row_scale`: float32 per weight row factor (null: none). Grouped (fused MoE) when `order` is set: the weight
    stacks experts of n rows each and token tile b is block b of the expert-sorted block table (order,
    block_expert, block_start, block_rows; `blocks` entries, 8·mt rows per block); a slot's input row is
    slot // top_k (top_k > 0) or the slot, its output row the slot (csrc/kernels.h MmaArgs)."""
    _C.mma_gemm(fmt_id, codes, meta, meta2, block_scale, tables, alpha, scale_mul, x, bias, y, ldy, m, n, k, chunks, mt,
                rt, splits, partials, tickets, stream, epilogue, row_scale, order, block_expert, block_start,
                block_rows, blocks, top_k)  # fmt: skip


def embedding_q8_0(table: int, ids: int, ids_int64: bool, out: int, t: int, v: int, h: int, stream: int) -> None:
    _C.embedding_q8_0(table, ids, ids_int64, out, t, v, h, stream)
