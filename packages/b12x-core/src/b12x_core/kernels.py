"""The one door from b12x_core to b12x_kernels: no other module of b12x_core imports it (tests/test_repository.py
checks), so what core asks of the device code is listed here.

- `interface`: the CUDA families' argument blocks and capability models (b12x_kernels.interface, pure Python).
- `block_scaled_mma`: SM12x's block-scaled mma.sync as data and its exact NumPy model (pure Python).
- The CUDA extension's bindings (`mma_gemm`, `gemv_elem`, ...): looked up on b12x_kernels at each call, so an
  install without the extension imports (each binding then raises, naming the missing build) and tests may replace a
  binding on b12x_kernels itself.
- The Triton modules (`tiles`, `act_quant`, `moe_route`, `topk_route`, `mma_dequant`, `moe_sorted`): imported on
  first use (`kernels.tiles`, or `from b12x_core.kernels import tiles` inside a function), so b12x_core imports where
  Triton does not.
"""

from __future__ import annotations

import importlib

import b12x_kernels
from b12x_kernels import block_scaled_mma, interface

__all__ = ["TRITON_MODULES", "block_scaled_mma", "bsmma_gemm", "bsmma_mma", "bsmma_quantize", "built",
           "compiled_archs", "embedding_q8_0", "fragment_mma_gemm", "fragment_mma_partial_floats",
           "fragment_mma_tickets", "gemv_elem", "gemv_ggml", "interface", "mma_blocks_per_sm",
           "mma_dequantize", "mma_gemm", "mma_smem_bytes", "not_built_reason", "sm90_mixed_built", "sm90_mixed_gemm",
           "sm90_mixed_reorder", "sm90_mixed_workspace_bytes", "sm90_moe_gemm", "sm90_moe_workspace_bytes",
           "unavailable_reason", "wgmma_blocks_per_sm", "wgmma_gemm"]  # fmt: skip

TRITON_MODULES = ("tiles", "act_quant", "moe_route", "topk_route", "mma_dequant", "moe_sorted")


def __getattr__(name: str):
    """A Triton module of b12x_kernels, imported on first use (ImportError where Triton is missing)."""
    if name in TRITON_MODULES:
        return importlib.import_module(f"b12x_kernels.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------------- what is installed
def built() -> bool:
    """Whether the CUDA extension is built and imported (it may still find no device: unavailable_reason)."""
    return b12x_kernels._C is not None


def compiled_archs() -> list[str]:
    """The architectures the CUDA extension holds code for ([] without it)."""
    return b12x_kernels.compiled_archs()


def not_built_reason() -> str:
    """Why this install has no CUDA extension and how to get it ('' when it has one)."""
    return b12x_kernels.not_built_reason()


def unavailable_reason() -> str:
    """Why the CUDA kernels cannot run here ('' when they can)."""
    return b12x_kernels.unavailable_reason()


# -------------------------------------------------------------------------------- the CUDA extension's bindings
# Arguments as b12x_kernels/__init__.py lists them: the family's packed argument block, then what changes per call.
def gemv_ggml(args: bytes, *per_call, **kwargs) -> None:
    b12x_kernels.gemv_ggml(args, *per_call, **kwargs)


def gemv_elem(args: bytes, *per_call, **kwargs) -> None:
    b12x_kernels.gemv_elem(args, *per_call, **kwargs)


def mma_gemm(args: bytes, *per_call, **kwargs) -> None:
    b12x_kernels.mma_gemm(args, *per_call, **kwargs)


def bsmma_gemm(args: bytes, *per_call, **kwargs) -> None:
    b12x_kernels.bsmma_gemm(args, *per_call, **kwargs)


def bsmma_quantize(args: bytes, *per_call, **kwargs) -> None:
    b12x_kernels.bsmma_quantize(args, *per_call, **kwargs)


def bsmma_mma(args: bytes, *per_call, **kwargs) -> None:
    b12x_kernels.bsmma_mma(args, *per_call, **kwargs)


def mma_dequantize(args: bytes, *per_call, **kwargs) -> None:
    b12x_kernels.mma_dequantize(args, *per_call, **kwargs)


def wgmma_gemm(args: bytes, *per_call, **kwargs) -> None:
    b12x_kernels.wgmma_gemm(args, *per_call, **kwargs)


def sm90_mixed_gemm(*args, **kwargs) -> None:
    b12x_kernels.sm90_mixed_gemm(*args, **kwargs)


def sm90_mixed_workspace_bytes(*args, **kwargs) -> int:
    return b12x_kernels.sm90_mixed_workspace_bytes(*args, **kwargs)


def sm90_mixed_reorder(*args, **kwargs) -> None:
    b12x_kernels.sm90_mixed_reorder(*args, **kwargs)


def sm90_moe_gemm(*args, **kwargs) -> None:
    b12x_kernels.sm90_moe_gemm(*args, **kwargs)


def sm90_moe_workspace_bytes(*args, **kwargs) -> int:
    return b12x_kernels.sm90_moe_workspace_bytes(*args, **kwargs)


def fragment_mma_gemm(*args, **kwargs) -> None:
    b12x_kernels.fragment_mma_gemm(*args, **kwargs)


def fragment_mma_partial_floats(m: int, n: int, splits: int, tokens: int) -> int:
    return b12x_kernels.fragment_mma_partial_floats(m, n, splits, tokens)


def fragment_mma_tickets(m: int, n: int, splits: int, tokens: int) -> int:
    return b12x_kernels.fragment_mma_tickets(m, n, splits, tokens)


def sm90_mixed_built() -> bool:
    """Whether the extension holds the Hopper CUTLASS GEMM (a build that targets sm_90 does)."""
    return built() and b12x_kernels.sm90_mixed_built()


def embedding_q8_0(*args) -> None:
    b12x_kernels.embedding_q8_0(*args)


def mma_blocks_per_sm(format_id: int, mt: int, rt: int, tiles: int = 8) -> int:
    """CTAs of mma_gemm one SM of the current device holds (0: that kernel does not fit)."""
    return b12x_kernels.mma_blocks_per_sm(format_id, mt, rt, tiles)


def mma_smem_bytes(format_id: int, mt: int, tiles: int = 8, resident_rows: int = 0, chunks_per_split: int = 0) -> int:
    """The dynamic shared memory one CTA of mma_gemm takes, counted on the host (0: no such kernel)."""
    return b12x_kernels.mma_smem_bytes(format_id, mt, tiles, resident_rows, chunks_per_split)


def wgmma_blocks_per_sm(format_id: int, mt: int) -> int:
    """CTAs of wgmma_gemm one SM of the current device holds (0 off sm_90)."""
    return b12x_kernels.wgmma_blocks_per_sm(format_id, mt)
