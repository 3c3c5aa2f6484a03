"""csrc/bsmma_gemm.cu's GEMM in NumPy: every lane's loads at the byte offsets the kernel reads them from (the repacked
weight, the activation pass's codes and scales), each instruction computed by b12x_kernels.block_scaled_mma's model.
So the repack, the activation layout and the kernel's addressing are held to the PTX fragment tables on a CPU; the
kernel's own arithmetic is the model's (the emulation equals it bit for bit: test_block_scaled_emulation.py). FP8's
plain E4M3 mma is MXF8's model with unit scales (exact products, fp32 sums: its layout is what this checks)."""

from __future__ import annotations

import numpy as np

from b12x_core.block_scaled import layout
from b12x_kernels import block_scaled_mma as bsm


def _words(buf: np.ndarray, offsets: np.ndarray, count: int) -> np.ndarray:
    """uint32 words at byte offsets (each 4-aligned): [..., count]."""
    idx = offsets[..., None] + 4 * np.arange(count)
    b = buf[idx[..., None] + np.arange(4)].astype(np.uint32)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _widen(h: np.ndarray) -> np.ndarray:
    """csrc widen_e2m1: four nibbles -> four byte containers, the code in bits 2-5."""
    h = h.astype(np.uint32)
    out = np.zeros_like(h)
    for e in range(4):
        out |= ((h >> (4 * e)) & 15) << (8 * e + 2)
    return out


def gemm(w: layout.BsmmaWeight, xq: np.ndarray, xs: np.ndarray, m: int, mt: int = 1) -> np.ndarray:
    """acc float32 [m, N] (before row_scale and bias) of the kernel on weight `w` and the pass's bytes xq / xs (uint8,
    [m, units · x_bytes] / [m, units · scale_bytes])."""
    name = w.instruction
    instr = layout.instruction(name)
    steps, units = layout.steps(name), w.units
    packed = layout.packed_a(name)
    a_bytes = steps * (8 if packed else 16)
    sfa_bytes = layout.scale_bytes(name)
    n16 = -(-w.n // layout.TILE_ROWS)
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    frags = -(-m // (8 * mt)) * mt  # the grid's token fragments (tokens past m: the last token, unstored)
    tok = np.minimum(8 * np.arange(frags)[:, None] + g[None, :], m - 1)  # [F, 32]
    xq, xs = np.ascontiguousarray(xq).reshape(-1), np.ascontiguousarray(xs).reshape(-1)
    row_x, row_s = units * layout.x_bytes(name), units * layout.scale_bytes(name)
    tile = np.arange(n16)[:, None]
    acc = np.zeros((n16, frags, 32, 4), np.float32)
    for u in range(units):
        for s in range(steps):
            base = ((tile * units + u) * 32 + lane[None, :]) * a_bytes  # [n16, 32]
            if packed:
                words = _words(w.codes, base + 8 * s, 2)
                a = np.stack([_widen(words[..., 0] & 0xFFFF), _widen(words[..., 0] >> 16),
                              _widen(words[..., 1] & 0xFFFF), _widen(words[..., 1] >> 16)], axis=-1)  # fmt: skip
            else:
                a = _words(w.codes, base + 16 * s, 4)
            slot = ((tile * units + u) * 16 + 2 * g[None, :] + (lane[None, :] & 1)) * sfa_bytes
            if not layout.scaled(name):  # the plain E4M3 mma: MXF8's model with every scale 2^0
                sfa = np.full((n16, 32), 0x7F7F7F7F, np.uint32)
                sfb = np.full(tok.shape, 0x7F7F7F7F, np.uint32)
            elif instr.scale_vec == 4:
                sfa = _words(w.scales, slot + 4 * s, 1)[..., 0]
                sfb = _words(xs, tok * row_s + u * row_s // units + 4 * s, 1)[..., 0]
            else:
                sfa = _words(w.scales, slot, 1)[..., 0] >> np.uint32(8 * s)
                sfb = _words(xs, tok * row_s + u * row_s // units, 1)[..., 0] >> np.uint32(8 * s)
            xoff = tok * row_x + u * layout.x_bytes(name) + 32 * s + 4 * t[None, :]
            b = np.stack([_words(xq, xoff, 1)[..., 0], _words(xq, xoff + 16, 1)[..., 0]], axis=-1)  # [F, 32, 2]
            acc = bsm.mma(instr, a[:, None], b[None], acc, sfa[:, None], sfb[None])
    # D element i: row 16·tile + g + 8·(i / 2), token 8·f + 2t + i % 2
    out = np.zeros((n16 * 16, frags * 8), np.float32)
    for i in range(4):
        rows = 16 * np.arange(n16)[:, None, None] + g[None, None, :] + 8 * (i // 2)
        cols = 8 * np.arange(frags)[None, :, None] + 2 * t[None, None, :] + i % 2
        out[rows, cols] = acc[..., i]
    return out[: w.n, :m].T
