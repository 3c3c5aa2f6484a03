"""Without a GPU the Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before b12x_kernels.tiles
is imported), with shims for two known defects: `tl.dot` on bf16 operands multiplies their raw uint16 storage
(Triton issue #11584), so bf16 operands are widened to float32 first (exact); float32 -> bf16 casts truncate,
a bias that sums over K, so they round to nearest even as the GPU does."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def hopper():
    """Skips unless an sm_90 GPU is here: the warpgroup MMA kernels (wgmma_gemm) run on Hopper only."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma_gemm runs on sm_90 (Hopper) only")


def _interpreter_without_gpu() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            return
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: it reads the variable once
        import numpy as np
        import triton.language as tl
        import triton.runtime.interpreter as interpreter
    except ImportError:
        return
    create_dot = interpreter.InterpreterBuilder.create_dot
    if getattr(create_dot, "b12x_shim", False):
        return

    def widened(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def dot(self, a, b, d, *args):
        return create_dot(self, widened(a), widened(b), d, *args)

    convert = interpreter._convert_float

    def convert_rounding(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            bits = np.ascontiguousarray(data).view(np.uint32).astype(np.uint64)
            return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return convert(data, src, dst, rounding_mode)

    dot.b12x_shim = True
    interpreter.InterpreterBuilder.create_dot = dot
    interpreter._convert_float = convert_rounding


_interpreter_without_gpu()
