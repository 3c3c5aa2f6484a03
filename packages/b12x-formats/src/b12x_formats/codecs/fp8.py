"""Per-tensor FP8 and 128×128 block FP8 (DeepSeek-V3 style): E4M3 weights times float32 scales."""

from __future__ import annotations

import numpy as np

from ..elements import E4M3_MAX, decode_e4m3, encode_e4m3
from ..spec import PER_TENSOR, Codec, FormatSpec, TensorSpec, per_tensor
from ._checks import reject_e4m3_nan, require_finite

BLOCK = 128


def _amax_scale(amax: np.ndarray) -> np.ndarray:
    """amax / 448, with 1.0 for all-zero tensors so that dequantization never divides by zero."""
    scale = np.asarray(amax, dtype=np.float32) / np.float32(E4M3_MAX)
    return np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)


class FP8(Codec):
    spec = FormatSpec(
        name="FP8",
        quant_algo="FP8",
        group_size=None,
        block_bytes=None,
        bits_per_weight=8.0,
        k_multiple=1,
        tensors=(
            TensorSpec("weight", "float8_e4m3fn", doc="E4M3 [..., N, K]"),
            TensorSpec("weight_scale", "float32", doc="per-tensor (or per-expert) dequantization scale"),
            TensorSpec("input_scale", "float32", required=False, doc="static activation scale"),
        ),
        activations=("bf16", "fp8"),
        doc="w = fp8 * weight_scale",
    )

    def logical_nk(self, weight_shape):
        return weight_shape[-2], weight_shape[-1]

    def expected_shapes(self, lead, n, k):
        return {"weight": lead + (n, k), "weight_scale": PER_TENSOR, "input_scale": PER_TENSOR}

    def quantize(self, w, importance):
        scale = _amax_scale(np.abs(w).max(axis=(-2, -1)))
        q = encode_e4m3(w / scale[..., None, None])
        return {"weight": q, "weight_scale": scale}

    def dequantize(self, tensors, lead, n, k):
        return decode_e4m3(tensors["weight"]) * per_tensor(tensors["weight_scale"], lead)

    def check_values(self, tensors):
        require_finite(self.spec.name, "weight_scale", tensors["weight_scale"], positive=True)
        if "input_scale" in tensors:
            require_finite(self.spec.name, "input_scale", tensors["input_scale"], positive=True)
        reject_e4m3_nan(self.spec.name, "weight", tensors["weight"])


class FP8Block(Codec):
    spec = FormatSpec(
        name="FP8_BLOCK",
        quant_algo="FP8_BLOCK",
        group_size=BLOCK,
        block_bytes=None,
        bits_per_weight=8.0 + 32 / (BLOCK * BLOCK),
        k_multiple=1,  # partial edge blocks are allowed: the scale grid is ceil(N/128) x ceil(K/128)
        tensors=(
            TensorSpec("weight", "float8_e4m3fn", doc="E4M3 [..., N, K]"),
            TensorSpec("weight_scale_inv", "float32", doc="[..., ceil(N/128), ceil(K/128)], multiplied"),
        ),
        activations=("bf16", "fp8"),
        aliases=("FP8_PB_WO", "FP8_BLOCKWISE"),
        doc="w[i,j] = fp8[i,j] * weight_scale_inv[i//128, j//128]",
    )

    def logical_nk(self, weight_shape):
        return weight_shape[-2], weight_shape[-1]

    def expected_shapes(self, lead, n, k):
        return {"weight": lead + (n, k), "weight_scale_inv": lead + (-(-n // BLOCK), -(-k // BLOCK))}

    def quantize(self, w, importance):
        *lead, n, k = w.shape
        nb, kb = -(-n // BLOCK), -(-k // BLOCK)
        padded = np.zeros((*lead, nb * BLOCK, kb * BLOCK), dtype=np.float32)
        padded[..., :n, :k] = np.abs(w)
        amax = padded.reshape(*lead, nb, BLOCK, kb, BLOCK).max(axis=(-3, -1))
        scale = _amax_scale(amax)
        return {"weight": encode_e4m3(w / _expand_blocks(scale, n, k)), "weight_scale_inv": scale}

    def dequantize(self, tensors, lead, n, k):
        scale = np.asarray(tensors["weight_scale_inv"], dtype=np.float32)
        return decode_e4m3(tensors["weight"]) * _expand_blocks(scale, n, k)

    def check_values(self, tensors):
        require_finite(self.spec.name, "weight_scale_inv", tensors["weight_scale_inv"], positive=True)
        reject_e4m3_nan(self.spec.name, "weight", tensors["weight"])


def _expand_blocks(scale: np.ndarray, n: int, k: int) -> np.ndarray:
    return np.repeat(np.repeat(scale, BLOCK, axis=-2)[..., :n, :], BLOCK, axis=-1)[..., :k]
