"""OCP MX v1.0 formats: 32-element blocks sharing one E8M0 power-of-two scale.

MXFP8 quantizes like ModelOpt (exponent = ceil(log2(amax / 448)), so no element overflows);
MXFP4 like the OCP spec (exponent = floor(log2 amax) - 2, values above 6·X saturate).
"""

from __future__ import annotations

import numpy as np

from ..elements import (
    decode_e2m1,
    decode_e4m3,
    decode_e8m0,
    e8m0_from_exponent,
    encode_e2m1,
    encode_e4m3,
    pack_nibbles,
    unpack_nibbles,
)
from ..spec import Codec, FormatSpec, TensorSpec, repeat_groups
from ._checks import reject_e4m3_nan, reject_e8m0_nan

BLOCK = 32


def _floor_log2(x: np.ndarray) -> np.ndarray:
    """Exact floor(log2 x) for x > 0 (frexp, not a rounded float log2)."""
    mantissa, exponent = np.frexp(x)  # x = m * 2^e, 0.5 <= m < 1
    return exponent - 1


def _ceil_log2(x: np.ndarray) -> np.ndarray:
    mantissa, exponent = np.frexp(x)
    return np.where(mantissa == 0.5, exponent - 1, exponent)


def _block_exponent(w: np.ndarray, rule) -> np.ndarray:
    """Integer exponent per 32-block of the last axis; all-zero blocks get the smallest scale."""
    amax = np.abs(w).reshape(*w.shape[:-1], -1, BLOCK).max(axis=-1)
    exponent = rule(np.where(amax > 0, amax, np.float32(1)))
    return np.where(amax > 0, exponent, -127).astype(np.int32)


def _scaled(w: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    # ldexp is exact, unlike dividing by a rounded power of two.
    return np.ldexp(w, -repeat_groups(np.clip(exponent, -127, 127), BLOCK, w.shape[-1])).astype(np.float32)


class MXFP8(Codec):
    spec = FormatSpec(
        name="MXFP8",
        quant_algo="MXFP8",
        group_size=BLOCK,
        block_bytes=BLOCK + 1,
        bits_per_weight=8.25,
        k_multiple=BLOCK,
        tensors=(
            TensorSpec("weight", "float8_e4m3fn", doc="E4M3 [..., N, K]"),
            TensorSpec("weight_scale", "uint8", doc="E8M0 [..., N, K/32]"),
        ),
        activations=("bf16", "mxfp8"),
        doc="w = e4m3 * 2^(s - 127)",
        block_scale_code="e8m0",
    )

    def logical_nk(self, weight_shape):
        return weight_shape[-2], weight_shape[-1]

    def expected_shapes(self, lead, n, k):
        return {"weight": lead + (n, k), "weight_scale": lead + (n, k // BLOCK)}

    def quantize(self, w, importance):
        exponent = _block_exponent(w, lambda amax: _ceil_log2(amax / np.float32(448.0)))
        return {"weight": encode_e4m3(_scaled(w, exponent)), "weight_scale": e8m0_from_exponent(exponent)}

    def dequantize(self, tensors, lead, n, k):
        scale = repeat_groups(decode_e8m0(tensors["weight_scale"]), BLOCK, k)
        return decode_e4m3(tensors["weight"]) * scale

    def check_values(self, tensors):
        reject_e8m0_nan(self.spec.name, "weight_scale", tensors["weight_scale"])
        reject_e4m3_nan(self.spec.name, "weight", tensors["weight"])


class MXFP4(Codec):
    spec = FormatSpec(
        name="MXFP4",
        quant_algo="MXFP4",
        group_size=BLOCK,
        block_bytes=BLOCK // 2 + 1,
        bits_per_weight=4.25,
        k_multiple=BLOCK,
        tensors=(
            TensorSpec("weight", "uint8", doc="[..., N, K/2], element 2i in the low nibble"),
            TensorSpec("weight_scale", "uint8", doc="E8M0 [..., N, K/32]"),
        ),
        activations=("bf16", "mxfp8"),
        doc="w = e2m1 * 2^(s - 127)",
        block_scale_code="e8m0",
        moe_activations=("bf16", "mxfp8"),
    )

    def logical_nk(self, weight_shape):
        return weight_shape[-2], weight_shape[-1] * 2

    def expected_shapes(self, lead, n, k):
        return {"weight": lead + (n, k // 2), "weight_scale": lead + (n, k // BLOCK)}

    def quantize(self, w, importance):
        exponent = _block_exponent(w, lambda amax: _floor_log2(amax) - 2)
        codes = encode_e2m1(_scaled(w, exponent))
        return {"weight": pack_nibbles(codes), "weight_scale": e8m0_from_exponent(exponent)}

    def dequantize(self, tensors, lead, n, k):
        scale = repeat_groups(decode_e8m0(tensors["weight_scale"]), BLOCK, k)
        return decode_e2m1(unpack_nibbles(tensors["weight"])) * scale

    def check_values(self, tensors):
        reject_e8m0_nan(self.spec.name, "weight_scale", tensors["weight_scale"])
