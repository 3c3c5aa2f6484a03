"""A numpy model of what csrc/mma_gemm.cu's lanes decode: the same tile indexing, the same bit tricks on the
same 32-bit words, the same bf16 roundings. It lets the CPU suite check the repacked layout and every decode
functor against the checkpoint oracle (b12x_formats.dequantize) before a GPU ever runs the kernel.

`effective_weight(mw)` returns the float32 [N, K] matrix the kernel multiplies by (before alpha and, for
FP8_BLOCK, before the fp32 block scale that the kernel applies to its accumulator)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from b12x_core.tensor_core import layout as mma_layout


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)


def _halves(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bf16x2 word -> (low element, high element) as float32."""
    return _bf16_bits_to_f32(w & 0xFFFF), _bf16_bits_to_f32(w >> 16)


def _bmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """mul.rn.bf16x2 on words: each half's product rounded to bf16."""
    (a0, a1), (b0, b1) = _halves(a), _halves(b)
    return _f32_to_bf16_bits(a0 * b0) | (_f32_to_bf16_bits(a1 * b1) << np.uint32(16))


def _splat(f: np.ndarray) -> np.ndarray:
    h = _f32_to_bf16_bits(f)
    return h | (h << np.uint32(16))


def _prmt(a: np.ndarray, b: np.ndarray, sel: np.ndarray) -> np.ndarray:
    a, b, sel = (np.asarray(v, dtype=np.uint64) for v in (a, b, sel))
    src = a | (b << np.uint64(32))
    out = np.zeros(np.broadcast(a, b, sel).shape, dtype=np.uint64)
    for i in range(4):
        idx = (sel >> np.uint64(4 * i)) & np.uint64(7)
        out |= ((src >> (idx * np.uint64(8))) & np.uint64(0xFF)) << np.uint64(8 * i)
    return out.astype(np.uint32)


def _e4m3_lo(w):
    return ((w << np.uint32(4)) & np.uint32(0x07F007F0)) | ((w << np.uint32(8)) & np.uint32(0x80008000))


def _e4m3_hi(w):
    return ((w >> np.uint32(4)) & np.uint32(0x07F007F0)) | (w & np.uint32(0x80008000))


def _e2m1(w, p):
    u32 = np.uint32
    if p < 3:  # magnitude and sign keep bf16's spacing: one shift, one mask
        return (w << u32(6 - mma_layout.E2M1_FIELDS[p][0])) & u32(0x81C081C0)
    return ((w >> u32(4)) & u32(0x00C000C0)) | ((w >> u32(5)) & u32(0x01000100)) | ((w << u32(1)) & u32(0x80008000))


def _e8m0(b):
    b = b.astype(np.uint32)
    return np.where(b == 0, np.uint32(0x00400000), b << np.uint32(23)).view(np.float32)


def _e4m3(b):
    return b.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def effective_weight(mw: mma_layout.MmaWeight, tables: np.ndarray | None = None) -> np.ndarray:
    fmt = mw.format
    n16 = -(-mw.n // 16)
    c = mw.chunks
    # words[n16, chunk, half, q, t, 4]: lane (q, t)'s four 32-bit words of a half-tile
    words = mw.codes.view("<u4").reshape(n16, c, 2, 8, 4, 4).astype(np.uint32)
    t_idx = np.arange(4).reshape(1, 1, 1, 1, 4)

    def meta(array, nbytes):
        return array.reshape(n16, c, 2, 8, 1, nbytes)  # broadcast over t

    groups = []  # per group g: four bf16x2 words [n16, c, 2, 8, 4]
    sm = np.float32(mw.scale_mul)
    if fmt in ("FP8", "FP8_BLOCK", "MXFP8"):
        if fmt == "MXFP8":
            b = np.take_along_axis(meta(mw.meta, 2), (t_idx >> 1)[..., None], axis=-1)[..., 0]
            mul = _splat(_e8m0(b) * sm)
        else:
            mul = _splat(sm)
        for g in range(2):
            w0, w1 = words[..., 2 * g], words[..., 2 * g + 1]
            groups.append([_bmul(p, mul) for p in (_e4m3_lo(w0), _e4m3_hi(w0), _e4m3_lo(w1), _e4m3_hi(w1))])
    elif fmt in ("MXFP4", "NVFP4", "W4A16_NVFP4"):
        if fmt == "MXFP4":
            b = np.take_along_axis(meta(mw.meta, 4), t_idx[..., None], axis=-1)[..., 0]
            muls = [_splat(_e8m0(b) * sm)] * 2
        else:
            m = meta(mw.meta, 8)
            muls = [_splat(_e4m3(np.take_along_axis(m, (2 * t_idx + i)[..., None], axis=-1)[..., 0]) * sm)
                    for i in (0, 1)]  # fmt: skip
        for g in range(4):
            w = words[..., g]
            groups.append([_bmul(_e2m1(w, p), muls[g >> 1]) for p in range(4)])
    elif fmt == "Q8_0":
        d = np.take_along_axis(meta(mw.meta, 4).view("<f2").astype(np.float32), (t_idx >> 1)[..., None], axis=-1)[
            ..., 0
        ]
        for g in range(2):
            pairs = []
            for w in (words[..., 2 * g], words[..., 2 * g + 1]):
                q = [((w >> np.uint32(8 * i)) & 0xFF).astype(np.float32) - 128 for i in range(4)]
                pairs += [_f32_to_bf16_bits(q[0] * d) | (_f32_to_bf16_bits(q[1] * d) << np.uint32(16)),
                          _f32_to_bf16_bits(q[2] * d) | (_f32_to_bf16_bits(q[3] * d) << np.uint32(16))]  # fmt: skip
            groups.append(pairs)
    else:  # IQ2
        xs = fmt == "IQ2_XS"
        grid_n = 512 if xs else 256
        row_d = meta(mw.meta, 2).view("<f2").astype(np.float32)[..., 0]  # multiplies the fp32 partial sums

        def sub(nibble):
            return _splat(np.float32(0.125) + np.float32(0.25) * nibble.astype(np.float32))

        if xs:
            sc = meta(mw.meta2, 8)
            two = np.take_along_axis(sc, (2 * t_idx)[..., None], axis=-1)[..., 0].astype(np.uint32) | (
                np.take_along_axis(sc, (2 * t_idx + 1)[..., None], axis=-1)[..., 0].astype(np.uint32) << np.uint32(8)
            )
            muls = [sub((two >> np.uint32(4 * h)) & 15) for h in range(4)]
        else:
            m0, m1 = sub(words[..., 1] >> np.uint32(28)), sub(words[..., 3] >> np.uint32(28))
            muls = [m0, m0, m1, m1]
        lo0 = lo1 = np.uint32(0x002CC800)
        hi0, hi1 = np.uint32(0x00424141), np.uint32(0x00C2C1C1)
        for g in range(8):
            if xs:
                v = words[..., g >> 1] >> np.uint32(16 * (g & 1))
                gi, si = v & 511, (v >> np.uint32(9)) & 127
            else:
                gi = (words[..., 2 * (g >> 2)] >> np.uint32(8 * (g & 3))) & 255
                si = (words[..., 2 * (g >> 2) + 1] >> np.uint32(7 * (g & 3))) & 127
            sel = tables[gi] | tables[grid_n + si]
            pairs = []
            for s in (sel, sel >> np.uint32(16)):
                lo, hi = _prmt(lo0, lo1, s), _prmt(hi0, hi1, s)
                pairs += [_prmt(lo, hi, 0x5140), _prmt(lo, hi, 0x7362)]
            groups.append([_bmul(p, muls[g >> 1]) for p in pairs])

    # element (g, pair i, half) of lane (q, t) in (n16, chunk, half h): row 16 n16 + q + 8h,
    # k = chunk·KB + E·t + 8g + 2i + half
    vals = np.stack([np.stack([np.stack(_halves(p), axis=-1) for p in pairs], axis=-2) for pairs in groups], axis=-3)
    if fmt.startswith("IQ2"):  # vals [n16, c, h, q, t, g, i, 2]; d per (n16, c, h, q)
        vals = vals * row_d[..., None, None, None]
    # vals: [n16, c, h, q, t, g, i, 2] -> [n16, h, q, c, t, g, i, 2] -> [N16, K_pad]
    w = vals.transpose(0, 2, 3, 1, 4, 5, 6, 7).reshape(n16 * 16, -1)
    return w[: mw.n, : mw.k]
