"""GGML block codecs stored raw (`packing: "ggml"`): `weight` is uint8 [..., N, K/group, block_bytes],
byte-identical to GGUF row storage. Decoding follows llama.cpp's C code operation for operation, so the
float32 results are bit-identical to `gguf.quants.dequantize`.
"""

from __future__ import annotations

import numpy as np

from .. import tables
from ..spec import Codec, FormatSpec, TensorSpec
from . import iq2_search


class _GGMLBlocks(Codec):
    """Shared shape logic: one `weight` tensor of whole blocks, an fp16 `d` in the first two bytes."""

    def logical_nk(self, weight_shape):
        if len(weight_shape) < 3:
            raise ValueError(
                f"{self.spec.name}: tensor 'weight' has shape {tuple(weight_shape)}; expected "
                f"[..., N, K/{self.spec.group_size}, {self.spec.block_bytes}] raw GGML blocks"
            )
        return weight_shape[-3], weight_shape[-2] * self.spec.group_size

    def expected_shapes(self, lead, n, k):
        return {"weight": lead + (n, k // self.spec.group_size, self.spec.block_bytes)}

    def dequantize(self, tensors, lead, n, k):
        blocks = np.ascontiguousarray(tensors["weight"]).reshape(-1, self.spec.block_bytes)
        return self.decode_blocks(blocks).reshape(lead + (n, k))

    def check_values(self, tensors):
        blocks = np.ascontiguousarray(tensors["weight"])
        d = blocks[..., :2].copy().view(np.float16)[..., 0]
        bad = ~np.isfinite(d)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"{self.spec.name}: tensor 'weight' {tuple(blocks.shape)} has a non-finite block scale d "
                f"({d[where]}) in block {where}; every GGML block's fp16 d must be finite"
            )

    def decode_blocks(self, blocks: np.ndarray) -> np.ndarray:
        """uint8 [B, block_bytes] -> float32 [B, group_size]."""
        raise NotImplementedError


def _ggml_spec(name: str, group: int, nbytes: int, doc: str) -> FormatSpec:
    return FormatSpec(
        name=name,
        quant_algo=name,
        group_size=group,
        block_bytes=nbytes,
        bits_per_weight=nbytes * 8 / group,
        k_multiple=group,
        tensors=(TensorSpec("weight", "uint8", doc=f"raw GGML blocks [..., N, K/{group}, {nbytes}]"),),
        activations=("bf16",),
        packing="ggml",
        doc=doc,
        moe_activations=("bf16",),
    )


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf (what llama.cpp and gguf use), not numpy's round-half-to-even."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


class Q8_0(_GGMLBlocks):
    QS_OFFSET = 2  # after d: 32 int8
    spec = _ggml_spec("Q8_0", 32, 34, "fp16 d, 32 int8 q; y = d * q")

    def quantize(self, w, importance):
        blocks = w.reshape(-1, 32)
        d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
        with np.errstate(divide="ignore"):
            inv_d = np.where(d == 0, np.float32(0), np.float32(1) / d)
        q = _round_half_away(blocks * inv_d).astype(np.int8)
        out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)
        return {"weight": out.reshape(*w.shape[:-1], w.shape[-1] // 32, 34)}

    def decode_blocks(self, blocks):
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        return d * blocks[:, self.QS_OFFSET :].view(np.int8).astype(np.float32)


class _IQ2(_GGMLBlocks):
    grid: staticmethod

    def decode_blocks(self, blocks):
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        grid_idx, sign_idx, nibble = self.fields(blocks)
        db = d * (np.float32(0.5) + nibble.astype(np.float32)) * np.float32(0.25)  # llama.cpp's order
        signs = (tables.ksigns_iq2xs()[sign_idx][..., None] >> np.arange(8, dtype=np.uint8)) & 1
        magnitudes = self.grid()[grid_idx].astype(np.float32)
        values = db[..., None] * magnitudes * np.where(signs == 1, np.float32(-1), np.float32(1))
        return values.reshape(len(blocks), 256)

    def quantize(self, w, importance):
        blocks = w.reshape(-1, 256)
        imp = None
        if importance is not None:
            imp = np.broadcast_to(importance[..., None, :], w.shape).reshape(-1, 256)
        found = iq2_search.quantize_blocks(blocks, imp, self.grid(), groups_per_scale=self.groups_per_scale)
        return {"weight": self.pack(found).reshape(*w.shape[:-1], w.shape[-1] // 256, self.spec.block_bytes)}

    def fields(self, blocks):
        """-> (grid index, 7-bit sign index, 4-bit sub-block scale), each [B, 32], one per group of 8."""
        raise NotImplementedError

    def pack(self, found: iq2_search.IQ2Blocks) -> np.ndarray:
        raise NotImplementedError


class IQ2_XXS(_IQ2):
    QS_OFFSET = 2  # after d: 8 sub-blocks of (u32 grid bytes, u32 sign indices + 4-bit scale)
    spec = _ggml_spec(
        "IQ2_XXS",
        256,
        66,
        "fp16 d; 8 sub-blocks of (u32 grid bytes, u32 sign indices + 4-bit scale); db = d*(0.5+s)/4",
    )
    grid = staticmethod(tables.iq2xxs_grid)
    groups_per_scale = 4  # one 4-bit scale per 32 weights

    def fields(self, blocks):
        qs = blocks[:, self.QS_OFFSET :].copy().view("<u4").reshape(-1, 8, 2)
        grid_idx = qs[..., 0:1].view(np.uint8).reshape(-1, 8, 4)
        aux1 = qs[..., 1:2]
        sign_idx = ((aux1 >> (7 * np.arange(4, dtype=np.uint32))) & 127).astype(np.uint8)
        nibble = np.broadcast_to(aux1 >> 28, (len(blocks), 8, 4))
        return grid_idx.reshape(-1, 32), sign_idx.reshape(-1, 32), nibble.reshape(-1, 32)

    def pack(self, found):
        b = len(found.d)
        grid_bytes = found.grid_idx.astype(np.uint8).reshape(b, 8, 4).copy().view("<u4")
        signs = found.sign_idx.astype(np.uint32).reshape(b, 8, 4) << (7 * np.arange(4, dtype=np.uint32))
        aux1 = signs.sum(axis=-1, dtype=np.uint32) | (found.scale.astype(np.uint32).reshape(b, 8) << 28)
        qs = np.stack([grid_bytes[..., 0], aux1], axis=-1).astype("<u4")
        return np.concatenate(
            [found.d.astype(np.float16).view(np.uint8).reshape(b, 2), qs.view(np.uint8).reshape(b, 64)], axis=1
        )


class IQ2_XS(_IQ2):
    QS_OFFSET = 2  # after d: 32 u16 (9-bit grid index, 7-bit sign index)
    SCALES_OFFSET = 66  # then 8 bytes of two 4-bit scales
    spec = _ggml_spec(
        "IQ2_XS",
        256,
        74,
        "fp16 d; 32 u16 (9-bit grid index, 7-bit sign index); 8 scale bytes (two 4-bit scales each)",
    )
    grid = staticmethod(tables.iq2xs_grid)
    groups_per_scale = 2  # one 4-bit scale per 16 weights

    def fields(self, blocks):
        qs = blocks[:, self.QS_OFFSET : self.SCALES_OFFSET].copy().view("<u2")
        scales = blocks[:, self.SCALES_OFFSET : self.spec.block_bytes]
        nibbles = np.stack([scales & 0x0F, scales >> 4], axis=-1).reshape(-1, 16)
        return (qs & 511), (qs >> 9).astype(np.uint8), np.repeat(nibbles, 2, axis=1)

    def pack(self, found):
        b = len(found.d)
        qs = (found.grid_idx.astype(np.uint16) | (found.sign_idx.astype(np.uint16) << 9)).astype("<u2")
        nib = found.scale.astype(np.uint8).reshape(b, 8, 2)
        scales = nib[..., 0] | (nib[..., 1] << 4)
        return np.concatenate(
            [found.d.astype(np.float16).view(np.uint8).reshape(b, 2), qs.view(np.uint8), scales], axis=1
        )
