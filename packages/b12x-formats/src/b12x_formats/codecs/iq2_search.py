"""Grid-search quantizer for IQ2_XXS and IQ2_XS.

A block of 256 weights is 32 groups of 8. Each group stores one grid point (8 magnitudes from {8, 25, 43})
and 7 sign bits (an 8th keeps the number of negatives even); each run of `groups_per_scale` groups shares a
4-bit scale l, and the block one fp16 d, so a group decodes as `d*(0.5+l)/4 * grid * signs`.

The search minimises a weighted squared error. Each element weighs sqrt(σ² + x²), σ² the block's mean
square, times the caller's importance (e.g. an imatrix's mean squared activation of its column) when one is
given — llama.cpp's weighting. Plain squared error is the wrong objective for real weights: it spends the
few levels on the many small weights and crushes the large ones the model depends on (on SmolLM2's
down_proj, 2.2–4.5× worse perplexity; docs/formats.md).

Search, vectorised over groups (numpy, chunked to stay in cache):
1. Signs follow the weights; when that leaves an odd count of negatives, the element whose flip costs the
   least (smallest importance·|x|) is flipped, and its target magnitude becomes -|x|.
2. For every group and every grid point g, P[g] = Σ w·t·G[g] and Q[g] = Σ w·G[g]² come from two small
   matmuls; the weighted error at scale s is then s²Q − 2sP (+ a constant), so trying a scale costs one
   multiply-subtract and an argmin over the grid, with the exact grid values (not llama.cpp's 1/3/5 proxy).
3. Per scale group, several starting scales are tried; each assignment's least-squares scale is kept when
   it lowers the error, then one more assignment pass at the best scale.
4. d is chosen so the largest scale maps to l = 15, rounded to fp16; each group's l is then the best of the
   three nearest integers, re-searching the grid at each quantized scale.
5. d is rescaled so the block's reconstruction is not biased towards zero (see the step in the code).
Measured against llama.cpp's own quantizer in docs/formats.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP = 8
CHUNK_BLOCKS = 64  # [64*32 groups, 512 grid points] float32 work arrays fit in L2
START_SCALES = np.linspace(0.55, 1.1, 8, dtype=np.float32)  # × (max |x| / 43) of the scale group
MAX_NIBBLE = 15
MAX_GAIN = np.float32(1.5)  # step 5's rescale of d; it stays near 1.06 on real weights


def _products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b.T for [n, 8] × [m, 8], summed in one fixed order. Not BLAS: its kernels (and their order of
    summation) change with the thread count, and an argmin between near-equal errors then picks another grid
    point; the bytes would depend on the machine and on --jobs (workers run one BLAS thread)."""
    out = a[:, :1] * b[:, 0]
    for j in range(1, a.shape[1]):
        out += a[:, j : j + 1] * b[:, j]
    return out


@dataclass
class IQ2Blocks:
    d: np.ndarray  # float32 [B], already representable in fp16
    grid_idx: np.ndarray  # [B, 32]
    sign_idx: np.ndarray  # [B, 32] 7-bit
    scale: np.ndarray  # [B, 32 / groups_per_scale] 4-bit


def quantize_blocks(x: np.ndarray, importance: np.ndarray | None, grid: np.ndarray, groups_per_scale: int) -> IQ2Blocks:
    """x float32 [B, 256]; importance float32 [B, 256] (>= 0) or None; grid uint8 [G, 8]."""
    grid = grid.astype(np.float32)
    parts = []
    for start in range(0, len(x), CHUNK_BLOCKS):
        chunk = x[start : start + CHUNK_BLOCKS]
        imp = None if importance is None else importance[start : start + CHUNK_BLOCKS]
        parts.append(_quantize_chunk(chunk, element_weights(chunk, imp), grid, groups_per_scale))
    return IQ2Blocks(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("d", "grid_idx", "sign_idx", "scale")))


def element_weights(x: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    """The search's weight of each element of x [B, 256]: sqrt(σ²_block + x²) (× importance when given)."""
    sigma2 = np.mean(x * x, axis=1, keepdims=True, dtype=np.float32)
    w = np.sqrt(sigma2 + x * x)
    return w if importance is None else w * importance


def _quantize_chunk(x, weights, grid, gps) -> IQ2Blocks:
    nblocks = len(x)
    xg = x.reshape(-1, GROUP)
    w = np.ascontiguousarray(weights, np.float32).reshape(-1, GROUP)
    ngroups = len(xg)
    nscales = ngroups // gps
    rows = np.arange(ngroups)

    # 1. signs with even parity
    negative = xg < 0
    magnitude = np.abs(xg)
    odd = (negative.sum(axis=1) & 1).astype(bool)
    flip = np.zeros_like(negative)
    flip[rows, np.argmin(w * magnitude, axis=1)] = odd
    target = np.where(flip, -magnitude, magnitude)
    sign_bits = negative ^ flip

    # 2. per-group correlations with every grid point
    p2 = 2 * _products(w * target, grid)
    q = _products(w, grid * grid)
    work = np.empty_like(q)

    def assign(scale_per_group_of_scales):
        """Best grid point per group at the given scales; returns (idx, ΣP, ΣQ) per scale group."""
        s = np.repeat(scale_per_group_of_scales, gps)[:, None]
        np.multiply(q, s, out=work)
        np.subtract(work, p2, out=work)
        idx = np.argmin(work, axis=1)
        p_sum = p2[rows, idx].reshape(nscales, gps).sum(axis=1) / 2
        q_sum = q[rows, idx].reshape(nscales, gps).sum(axis=1)
        return idx, p_sum, q_sum

    # 3. free (unquantized) scale per scale group
    peak = np.abs(target).reshape(nscales, -1).max(axis=1) / np.float32(grid.max())
    best_err = np.full(nscales, np.inf, np.float32)
    best_scale = np.zeros(nscales, np.float32)
    for trial in [*(peak * c for c in START_SCALES), None]:
        idx, p_sum, q_sum = assign(best_scale if trial is None else trial)
        fitted = np.where(q_sum > 0, p_sum / np.maximum(q_sum, np.float32(1e-30)), 0).astype(np.float32)
        err = -p_sum * fitted
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, fitted, best_scale)
    best_scale = np.maximum(best_scale, 0)

    # 4. quantize: d per block (fp16), 4-bit l per scale group, regrid at each quantized scale
    per_block = nscales // nblocks
    top = best_scale.reshape(nblocks, per_block).max(axis=1)
    d = top * np.float32(8 / (2 * MAX_NIBBLE + 1))
    if (d > np.finfo(np.float16).max).any():
        raise ValueError("IQ2: weights too large for an fp16 block scale (|w| must stay below about 1e7)")
    d = d.astype(np.float16).astype(np.float32)
    d_per_scale = np.repeat(d, per_block)
    safe_d = np.where(d_per_scale > 0, d_per_scale, np.float32(1))
    nearest = np.clip(np.round((8 * best_scale / safe_d - 1) / 2), 0, MAX_NIBBLE)
    out_err = np.full(nscales, np.inf, np.float32)
    out_l = nearest.copy()
    out_idx = np.zeros(ngroups, np.int64)
    out_proj = np.zeros(nscales, np.float32)  # Σ w·x·x̂ of the kept choice
    for step in (0, -1, 1):
        level = np.clip(nearest + step, 0, MAX_NIBBLE)
        # The decoder's db = d*(0.5+l)*0.25 = d*(2l+1)/8: the same float32 operations, so the same scale.
        scale = d_per_scale * (np.float32(0.5) + level.astype(np.float32)) * np.float32(0.25)
        idx, p_sum, q_sum = assign(scale)
        err = scale * scale * q_sum - 2 * scale * p_sum
        better = err < out_err
        out_err = np.where(better, err, out_err)
        out_l = np.where(better, level, out_l)
        out_idx = np.where(np.repeat(better, gps), idx, out_idx)
        out_proj = np.where(better, scale * p_sum, out_proj)

    # 5. unbias: least squares leaves x̂ shorter than x (its error is orthogonal to x̂, not to x), so every
    # layer's output would come out a few percent small, a bias that compounds through a deep model (SmolLM2's
    # down_proj: 6% short, measurably worse perplexity). Scaling d so that Σ w·x·x̂ = Σ w·x² per block removes
    # it at a small cost in squared error.
    norm = (w * xg * xg).reshape(nblocks, -1).sum(axis=1)
    proj = out_proj.reshape(nblocks, -1).sum(axis=1)
    gain = np.where(proj > 0, norm / np.where(proj > 0, proj, 1), 1).clip(1, MAX_GAIN)
    d = np.minimum(d * gain, np.finfo(np.float16).max).astype(np.float16).astype(np.float32)

    sign_idx = np.packbits(sign_bits[:, :7], axis=1, bitorder="little")[:, 0]
    return IQ2Blocks(
        d=d,
        grid_idx=out_idx.reshape(nblocks, -1),
        sign_idx=sign_idx.reshape(nblocks, -1),
        scale=out_l.astype(np.uint8).reshape(nblocks, -1),
    )
