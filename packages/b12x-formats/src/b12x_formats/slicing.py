"""Cut a QuantizedWeight along N (rows) and K (columns) on whole quantization blocks, without decoding.

Tensor parallelism shards weights this way: column-parallel layers take a range of rows, row-parallel
layers a range of K, fused MoE both (w13 rows, w2 columns). Each tensor's role comes from the codec's
expected shapes, so every format is handled by one rule: a tensor with n_t rows covers N / n_t weight rows
per entry (1, or 128 for FP8_BLOCK scales), one with k_t columns covers K / k_t weight columns (1/2 for
packed FP4 bytes, 16/32 for block scales, the group for GGML blocks). Per-tensor scales are kept.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .quantized import QuantizedWeight, codec_for
from .spec import PER_TENSOR, PROBE


def slice_weight(
    qw: QuantizedWeight, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None
) -> QuantizedWeight:
    """Rows [r0, r1) and columns [c0, c1) of the logical [..., N, K] weight. Raises ValueError unless both
    ranges start and end on block boundaries (or at N / K)."""
    codec = codec_for(qw.format)
    *lead, n, k = qw.shape
    lead = tuple(lead)
    r0, r1 = rows if rows is not None else (0, n)
    c0, c1 = cols if cols is not None else (0, k)
    if not (0 <= r0 < r1 <= n and 0 <= c0 < c1 <= k):
        raise ValueError(f"{qw.format}: rows {r0}:{r1} / cols {c0}:{c1} out of range for weight {list(qw.shape)}")
    out = {}
    probe = codec.expected_shapes(lead, PROBE, PROBE)
    for name, expected in codec.expected_shapes(lead, n, k).items():
        if name not in qw.tensors:
            continue
        t = qw.tensors[name]
        if expected == PER_TENSOR:
            out[name] = t
            continue
        row_axis, col_axis = len(lead), len(lead) + 1
        index = [slice(None)] * t.ndim
        for axis, (lo, hi, full, what) in ((row_axis, (r0, r1, n, "rows")), (col_axis, (c0, c1, k, "cols"))):
            per_entry = Fraction(PROBE, probe[name][axis])  # weight rows/cols covered by one entry of this tensor
            index[axis] = slice(
                _entry(lo, per_entry, full, qw.format, name, what), _entry(hi, per_entry, full, qw.format, name, what)
            )
        out[name] = np.ascontiguousarray(t[tuple(index)])
    return QuantizedWeight.from_tensors(qw.format, out)


def _entry(position: int, per_entry: Fraction, full: int, fmt: str, name: str, what: str) -> int:
    if position == full:
        return int(-(-Fraction(full) // per_entry))  # a partial last block (FP8_BLOCK) is kept whole
    entry = Fraction(position) / per_entry
    if entry.denominator != 1:
        raise ValueError(
            f"{fmt}: cannot cut {what} at {position}: tensor '{name}' stores {per_entry} {what} per entry, "
            f"so cuts must fall on multiples of {per_entry}"
        )
    return int(entry)


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Stack weights of one format along N (e.g. the gate and up shards of a gated MoE's w13). Per-tensor
    scales must be equal in every part; row-indexed tensors are concatenated without decoding."""
    first = parts[0]
    codec = codec_for(first.format)
    *lead, n, k = first.shape
    lead = tuple(lead)
    if any(p.format != first.format or tuple(p.shape[:-2]) != lead or p.shape[-1] != k for p in parts):
        raise ValueError(f"concat_rows: parts must share format, leading dims and K, got {[repr(p) for p in parts]}")
    out = {}
    for name, expected in codec.expected_shapes(lead, n, k).items():
        if name not in first.tensors:
            continue
        tensors = [p.tensors[name] for p in parts]
        if expected == PER_TENSOR:
            if any(not np.array_equal(t, tensors[0]) for t in tensors[1:]):
                raise ValueError(f"concat_rows: {first.format} per-tensor '{name}' differs between parts")
            out[name] = tensors[0]
        else:
            out[name] = np.concatenate(tensors, axis=len(lead))
    return QuantizedWeight.from_tensors(first.format, out)
