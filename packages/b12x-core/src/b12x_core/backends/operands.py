"""Activation operands as the backends multiply them, made by one fused Triton pass into scratch, following the
rules of b12x_core.activations (the contract):

- `fp8_operands`: e4m3 codes plus their scales (per token or per token × 128), for fp8 tensor-core GEMMs;
- `bf16_operands`: values bf16 holds exactly, plus the scale still to apply: mxfp8 x̂ (e4m3·2^e), nvfp4 x̂
  without its per-tensor input_scale (e2m1·sf), fp8 codes as their values. Per-tensor factors (a static fp8
  scale, nvfp4's input_scale) are the caller's, folded into its weight factors (weights.TENSOR_ACTIVATION_SCALE).

Each returns operands carved from the device's scratch; the `*_specs` functions size that scratch.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import kernels, workspace
from .base import cuda_reason

FP8_MODES = ("fp8_static", "fp8_token", "fp8_group128")
BF16_EXACT_MODES = ("bf16", "mxfp8", "nvfp4", "fp8_static")  # the modes bf16_operands serves


def _groups(k: int) -> int:
    from b12x_formats.kernel_facts import FP8_BLOCK_SIZE

    return -(-k // FP8_BLOCK_SIZE)


def fp8_specs(act_mode: str, m: int, k: int) -> list:
    return [((m, k), torch.uint8), ((m,), torch.float32), ((m, _groups(k)), torch.float32)]


def _static_scale(act_mode: str, input_scale: float | None) -> float:
    return float(np.float32(input_scale)) if act_mode == "fp8_static" else 1.0


def fp8_operands(x2: torch.Tensor, act_mode: str, input_scale: float | None):
    """-> (e4m3 codes [m, k] as float8_e4m3fn, per-token scale [m] or None, per-token×128 scale [m, ⌈k/128⌉] or
    None). fp8_static's scale is the caller's (per-tensor)."""
    from ..kernels import act_quant

    m, k = x2.shape
    codes, row, groups = workspace.carve(x2.device, fp8_specs(act_mode, m, k))
    row = row if act_mode == "fp8_token" else None
    groups = groups if act_mode == "fp8_group128" else None
    scales = row if row is not None else groups
    act_quant.quantize_fp8(x2, act_mode, codes, scales, _static_scale(act_mode, input_scale))
    return codes.view(torch.float8_e4m3fn), row, groups


def x_scale_cols(act_mode: str, k: int) -> int:
    """float32 activation scales per token that bf16_operands returns: 1, ⌈k/128⌉ (fp8_group128) or 0 (none)."""
    if act_mode not in FP8_MODES:
        return 0
    return _groups(k) if act_mode == "fp8_group128" else 1


def bf16_specs(act_mode: str, m: int, k: int) -> list:
    if act_mode == "bf16":
        return []
    if act_mode in FP8_MODES:
        return [((m, k), torch.bfloat16), ((m, x_scale_cols(act_mode, k)), torch.float32)]
    return [((m, k), torch.bfloat16)]


def _global_scale(act_mode: str, input_scale: float | None) -> float:
    return float(np.float32(1.0) / np.float32(input_scale)) if act_mode == "nvfp4" else 1.0


def in_kernel_scale(act_mode: str, input_scale: float | None) -> float:
    """The scale a kernel that quantizes the activations itself takes for `act_mode` (b12x_kernels.interface
    MmaArgs.x_quant_scale): the one bf16_operands hands act_quant, fp8 static's input_scale or nvfp4's global
    scale 1 / input_scale, both float32 as there; 0 for the modes that need none."""
    if act_mode == "fp8_static":
        return _static_scale(act_mode, input_scale)
    if act_mode == "nvfp4":
        return _global_scale(act_mode, input_scale)
    return 0.0


def bf16_operands(x2: torch.Tensor, act_mode: str, input_scale: float | None, buffers=None):
    """-> (bf16 values [m, k], float32 activation scales [m, 1] / [m, ⌈k/128⌉] or None). `buffers`: carved
    bf16_specs (carved here when None)."""
    if act_mode == "bf16":
        return x2, None
    from ..kernels import act_quant

    m, k = x2.shape
    buffers = buffers or workspace.carve(x2.device, bf16_specs(act_mode, m, k))
    values = buffers[0]
    if act_mode in FP8_MODES:
        scale = None if act_mode == "fp8_static" else buffers[1]
        act_quant.quantize_fp8(x2, act_mode, values, scale, _static_scale(act_mode, input_scale))
        return values, scale
    return act_quant.quantize_activation(x2, act_mode, values, _global_scale(act_mode, input_scale)), None


def mma_layout_reason(q) -> str:
    """Why a GEMM on the repacked "mma" layout (tensor_core, and its Hopper form tensor_core_wgmma) cannot run `q`
    beyond its format list, or "" when it can: bf16-exact activations, 16-byte activation pieces, its own copy of
    the weight, a CUDA device with the kernels."""
    modes = kernels.interface.MMA.act_modes
    if q.act_mode not in modes:
        return f"needs bf16-exact activations ({', '.join(modes)}), not {q.act_mode}"
    if q.k % 8:
        return f"stages activations in 16-byte pieces: needs K % 8 == 0, K is {q.k}"
    if q.shares_bytes:
        return "repacks the weight into its own layout; this op shares another op's bytes (tied head)"
    return cuda_reason(q) or ""
