"""NVFP4 (ModelOpt): E2M1 weights, one UE4M3 scale per 16 weights, one float32 global scale.

W4A16_NVFP4 stores the same tensors; only the activation mode differs (bf16 instead of NVFP4).
Quantization follows ModelOpt: weight_scale_2 = amax / (6 * 448); block scale = block_amax / (6 *
weight_scale_2) rounded to E4M3 (a zero block scale becomes 1.0); elements round half to even.
"""

from __future__ import annotations

import numpy as np

from ..elements import (
    E2M1_MAX,
    E4M3_MAX,
    decode_e2m1,
    decode_e4m3,
    encode_e2m1,
    encode_e4m3,
    pack_nibbles,
    unpack_nibbles,
)
from ..spec import PER_TENSOR, Codec, FormatSpec, TensorSpec, per_tensor, repeat_groups
from ._checks import reject_e4m3_nan, require_finite

BLOCK = 16


class NVFP4(Codec):
    spec = FormatSpec(
        name="NVFP4",
        quant_algo="NVFP4",
        group_size=BLOCK,
        block_bytes=BLOCK // 2 + 1,
        bits_per_weight=4.5,
        k_multiple=BLOCK,
        tensors=(
            TensorSpec("weight", "uint8", doc="[..., N, K/2], element 2i in the low nibble"),
            TensorSpec("weight_scale", "float8_e4m3fn", doc="UE4M3 [..., N, K/16], linear row-major"),
            TensorSpec("weight_scale_2", "float32", doc="global scale = amax / (6 * 448)"),
            TensorSpec("input_scale", "float32", required=False, doc="activation global scale (W4A4)"),
        ),
        activations=("bf16", "nvfp4", "mxfp8"),
        doc="w = e2m1 * weight_scale[n, k // 16] * weight_scale_2",
        block_scale_code="e4m3",
        moe_activations=("bf16", "nvfp4", "mxfp8"),
    )

    def logical_nk(self, weight_shape):
        return weight_shape[-2], weight_shape[-1] * 2

    def expected_shapes(self, lead, n, k):
        return {
            "weight": lead + (n, k // 2),
            "weight_scale": lead + (n, k // BLOCK),
            "weight_scale_2": PER_TENSOR,
            "input_scale": PER_TENSOR,
        }

    def quantize(self, w, importance):
        *lead, n, k = w.shape
        amax = np.abs(w).max(axis=(-2, -1))
        global_scale = (amax / np.float32(E2M1_MAX * E4M3_MAX)).astype(np.float32)
        global_scale = np.where(global_scale > 0, global_scale, np.float32(1.0)).astype(np.float32)
        block_amax = np.abs(w).reshape(*lead, n, k // BLOCK, BLOCK).max(axis=-1)
        block_scale = encode_e4m3(block_amax / (np.float32(E2M1_MAX) * global_scale[..., None, None]))
        block_value = decode_e4m3(block_scale)
        block_scale = np.where(block_value > 0, block_scale, encode_e4m3(np.float32(1.0)))
        denom = repeat_groups(decode_e4m3(block_scale), BLOCK, k) * global_scale[..., None, None]
        codes = encode_e2m1(w / denom)
        return {"weight": pack_nibbles(codes), "weight_scale": block_scale, "weight_scale_2": global_scale}

    def dequantize(self, tensors, lead, n, k):
        block = repeat_groups(decode_e4m3(tensors["weight_scale"]), BLOCK, k)
        return decode_e2m1(unpack_nibbles(tensors["weight"])) * block * per_tensor(tensors["weight_scale_2"], lead)

    def check_values(self, tensors):
        name = self.spec.name
        require_finite(name, "weight_scale_2", tensors["weight_scale_2"], positive=True)
        if "input_scale" in tensors:
            require_finite(name, "input_scale", tensors["input_scale"], positive=True)
        reject_e4m3_nan(name, "weight_scale", tensors["weight_scale"])
        require_finite(name, "weight_scale", decode_e4m3(tensors["weight_scale"]), positive=True)


class W4A16NVFP4(NVFP4):
    spec = FormatSpec(
        name="W4A16_NVFP4",
        quant_algo="W4A16_NVFP4",
        group_size=BLOCK,
        block_bytes=BLOCK // 2 + 1,
        bits_per_weight=4.5,
        k_multiple=BLOCK,
        tensors=NVFP4.spec.tensors,
        activations=("bf16",),
        doc=NVFP4.spec.doc + " (weight-only: activations stay bf16)",
        block_scale_code="e4m3",
        moe_activations=("bf16",),
    )
