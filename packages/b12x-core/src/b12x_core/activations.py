"""Activation quantization, exactly as the kernels do it, on torch tensors of any device.

Every mode returns x̂ in float32: the value the tensor cores multiply, so `x̂ @ W.T` in float32 is the
reference of a W8A8 / W4A4 kernel. The rounding rules are the contract kernels must match:

| mode | groups | scale | element |
|---|---|---|---|
| `bf16` | - | - | x unchanged |
| `fp8_static` | tensor | `input_scale` from the checkpoint | e4m3(clamp(x / s, ±448)) |
| `fp8_token` | per token | amax / 448 (1 for all-zero tokens) | e4m3(x / s) |
| `fp8_group128` | per token × 128 channels | amax / 448 (1 for all-zero groups) | e4m3(x / s) |
| `mxfp8` | per token × 32 channels | 2^(floor(log2 amax) − 8) (OCP), E8M0 | e4m3(clamp(x / s, ±448)) |
| `nvfp4` | per token × 16 channels | sf = e4m3(amax/6 · g), g = 1/input_scale | q = e2m1(x · (g/sf)) |

nvfp4's x̂ is q · sf · input_scale: the kernels' epilogue multiplies by input_scale · weight_scale_2.

Rounding is to nearest, ties to even, saturating. Division by a power of two is exact (ldexp).
"""

from __future__ import annotations

import numpy as np
import torch

E4M3_MAX = 448.0
MODES = ("bf16", "fp8_static", "fp8_token", "fp8_group128", "mxfp8", "nvfp4")


def round_e4m3(v: torch.Tensor) -> torch.Tensor:
    """float32 -> nearest E4M3 value (ties to even), saturating at ±448, back in float32."""
    return v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """float32 -> nearest E2M1 value {0, .5, 1, 1.5, 2, 3, 4, 6} (ties to the even code), saturating at ±6."""
    a = v.abs()
    # Ties: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4 (the neighbour with the even code).
    r = torch.where(a <= 0.25, 0.0, 0.5)
    r = torch.where(a >= 0.75, 1.0, r)
    r = torch.where(a > 1.25, 1.5, r)
    r = torch.where(a >= 1.75, 2.0, r)
    r = torch.where(a > 2.5, 3.0, r)
    r = torch.where(a >= 3.5, 4.0, r)
    r = torch.where(a > 5.0, 6.0, r)
    return torch.copysign(r, v)


def _grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    """[T, K] -> [T, ceil(K/group), group], zero-padded (zeros change no amax)."""
    t, k = x.shape
    pad = (-k) % group
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    # explicit sizes, not -1: a reshape cannot infer a dimension of a 0-token (empty) tensor
    return x.reshape(t, (k + pad) // group, group)


def _ungrouped(g: torch.Tensor, k: int) -> torch.Tensor:
    """[T, G, group] -> [T, K], dropping _grouped's zero padding."""
    return g.reshape(g.shape[0], g.shape[1] * g.shape[2])[:, :k]


def _div(t: torch.Tensor, divisor: float) -> torch.Tensor:
    """t / divisor correctly rounded on every device: CUDA divides by a host scalar as a multiplication by its
    rounded reciprocal, which moves scales by an ulp and flips e4m3 codes against the CPU reference."""
    return t / torch.full_like(t, divisor)


def _amax_scale(amax: torch.Tensor) -> torch.Tensor:
    scale = _div(amax, E4M3_MAX)
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quantize_activation(x: torch.Tensor, mode: str, input_scale: float | None = None) -> torch.Tensor:
    """x: [T, K] (any float dtype) -> x̂ float32 [T, K]."""
    x = x.to(torch.float32)
    t, k = x.shape
    if mode == "bf16":
        return x
    if mode in ("fp8_static", "fp8_token", "fp8_group128"):
        if mode == "fp8_static" and input_scale is None:
            raise ValueError("fp8_static activations need the checkpoint's input_scale")
        q, token_scale, group_scale = fp8_operands(x, mode, input_scale)
        if token_scale is not None:
            return q.to(torch.float32) * token_scale[:, None]
        if group_scale is not None:
            return q.to(torch.float32) * group_scale.repeat_interleave(128, dim=1)[:, :k]
        return q.to(torch.float32) * torch.tensor(input_scale, dtype=torch.float32, device=x.device)
    if mode == "mxfp8":
        g = _grouped(x, 32)
        amax = g.abs().amax(dim=2, keepdim=True)
        _, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
        exponent = torch.where(amax > 0, e - 1 - 8, torch.full_like(e, -127)).clamp(-127, 127)
        return _ungrouped(torch.ldexp(round_e4m3(torch.ldexp(g, -exponent)), exponent), k)
    if mode == "nvfp4":
        if input_scale is None:
            raise ValueError("nvfp4 activations need the checkpoint's input_scale")
        scale = torch.tensor(input_scale, dtype=torch.float32, device=x.device)
        return nvfp4_values(x, input_scale) * scale
    raise ValueError(f"unknown activation mode {mode!r}; known: {MODES}")


def nvfp4_values(x: torch.Tensor, input_scale: float) -> torch.Tensor:
    """nvfp4 x̂ without its per-tensor factor: q · sf (exact in bf16: at most 6 significant bits), float32."""
    x = x.to(torch.float32)
    t, k = x.shape
    # float32 arithmetic on host scalars: no host-to-device copy, so this runs inside CUDA graph capture
    global_scale = float(np.float32(1.0) / np.float32(input_scale))
    g = _grouped(x, 16)
    sf = round_e4m3(_div(g.abs().amax(dim=2, keepdim=True), 6.0) * global_scale)
    # a tensor numerator: `float / tensor` would multiply by a rounded reciprocal
    out_scale = torch.where(sf > 0, torch.full_like(sf, global_scale) / sf, torch.zeros_like(sf))
    return _ungrouped(round_e2m1(g * out_scale) * sf, k)


def fp8_operands(x: torch.Tensor, mode: str, input_scale: float | None = None):
    """The e4m3 codes and scales of the fp8 modes, as W8A8 kernels consume them:
    -> (q float8_e4m3fn [T, K], per-token scale [T] or None, per-token×128 scale [T, ⌈K/128⌉] or None).
    x̂ = q · scale (fp8_static's per-tensor scale is the caller's to apply)."""
    x = x.to(torch.float32)
    t, k = x.shape
    if mode == "fp8_static":
        q = _div(x, float(np.float32(input_scale))).clamp(-E4M3_MAX, E4M3_MAX)
        return q.to(torch.float8_e4m3fn), None, None
    if mode == "fp8_token":
        s = _amax_scale(x.abs().amax(dim=1, keepdim=True))
        return (x / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s.reshape(t), None
    if mode == "fp8_group128":
        g = _grouped(x, 128)
        s = _amax_scale(g.abs().amax(dim=2, keepdim=True))
        q = _ungrouped((g / s).clamp(-E4M3_MAX, E4M3_MAX), k).contiguous()
        return q.to(torch.float8_e4m3fn), None, s.reshape(t, s.shape[1]).contiguous()
    raise ValueError(f"{mode!r} is not an fp8 activation mode")
