"""The tensor-core GEMM's prepare-time layout: lossless (unpacks to the checkpoint bytes) and, through a numpy
model of the kernel's lanes (mma_emulator.py), decoding to the checkpoint's values — exactly for the formats
whose products are exact in bf16, within one bf16 rounding for Q8_0 and IQ2 (the kernel's stated tolerance)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from mma_emulator import effective_weight

import b12x_formats as bf
from b12x_core.tensor_core import geometry
from b12x_core.tensor_core import layout as mma_layout

FORMATS = ["FP8", "FP8_BLOCK", "MXFP8", "NVFP4", "MXFP4", "Q8_0", "IQ2_XXS", "IQ2_XS"]
EXACT = {"FP8", "FP8_BLOCK", "MXFP8", "NVFP4", "MXFP4"}


def _k_multiple(fmt: str) -> int:
    return bf.spec(fmt).k_multiple


def _weight(rng, fmt: str, n: int, k: int) -> bf.QuantizedWeight:
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.choice([1e-3, 1.0, 40.0])
    w[rng.random((n, k)) < 0.02] *= 30  # outliers stretch the block scales
    return bf.quantize(w, fmt)


def _shapes(fmt: str):
    km = _k_multiple(fmt)
    ck = geometry.chunk_k(fmt)
    # smallest legal K, an odd multiple, a multiple of the chunk plus a tail; N odd and sub-tile
    return [(1, km), (17, 3 * km), (40, 2 * ck + km), (33, 5 * km)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_layout_is_lossless(rng, fmt):
    for n, k in _shapes(fmt):
        qw = _weight(rng, fmt, n, k)
        mw = mma_layout.pack(qw)
        back = mma_layout.unpack(mw)
        weight = np.ascontiguousarray(qw.tensors["weight"]).view(np.uint8).reshape(n, -1)
        np.testing.assert_array_equal(back["weight"].reshape(n, -1), weight, err_msg=f"{fmt} {n}x{k}")
        if "weight_scale" in back:
            scales = np.ascontiguousarray(qw.tensors["weight_scale"]).view(np.uint8).reshape(n, -1)
            np.testing.assert_array_equal(back["weight_scale"], scales)


@pytest.mark.parametrize("fmt", FORMATS)
def test_layout_is_no_larger_than_the_checkpoint_plus_padding(rng, fmt):
    n, k = 64, 4 * geometry.chunk_k(fmt)  # no padding: exactly the checkpoint's bytes
    qw = _weight(rng, fmt, n, k)
    mw = mma_layout.pack(qw)
    stored = sum(a.nbytes for a in (mw.codes, mw.meta, mw.meta2, mw.block_scale) if a is not None)
    checkpoint = sum(np.asarray(v).nbytes for v in qw.tensors.values() if np.asarray(v).size > 1)
    assert stored <= checkpoint


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_lanes_decode_the_checkpoint_values(rng, fmt):
    tables = mma_layout.iq2_tables(fmt) if fmt.startswith("IQ2") else None
    for n, k in _shapes(fmt):
        qw = _weight(rng, fmt, n, k)
        mw = mma_layout.pack(qw)
        got = effective_weight(mw, tables) * np.float32(mw.alpha)  # float32 products, as the reference's
        if fmt == "FP8_BLOCK":
            got *= np.repeat(np.repeat(mw.block_scale, 128, 0), 128, 1)[:n, :k]
        want = bf.dequantize(qw)
        if fmt in EXACT:
            np.testing.assert_array_equal(got, want, err_msg=f"{fmt} {n}x{k}")
        elif fmt == "Q8_0":  # q·d (exact in fp32) rounded to bf16 once
            np.testing.assert_array_equal(got, want.astype(ml_dtypes.bfloat16).astype(np.float32))
        else:  # IQ2: grid·sign·(0.5+s)/4 rounded to bf16 once; d multiplies in fp32
            assert np.all(np.abs(got - want) <= 2.0**-8 * np.abs(want)), f"{fmt} {n}x{k}"


def test_iq2_tables_decode_the_grid(rng):
    from b12x_formats import tables

    for fmt, grid in (("IQ2_XXS", tables.iq2xxs_grid()), ("IQ2_XS", tables.iq2xs_grid())):
        t = mma_layout.iq2_tables(fmt)
        grid = np.asarray(grid, dtype=np.uint8).reshape(-1, 8)
        values = np.array([8, 25, 43])[(t[: len(grid), None] >> (4 * np.arange(8))) & 3]
        np.testing.assert_array_equal(values, grid)
        neg = (t[len(grid) :, None] >> (4 * np.arange(8) + 2)) & 1
        np.testing.assert_array_equal(neg, (tables.ksigns_iq2xs()[:, None] >> np.arange(8)) & 1)


def _accepted_by_the_family() -> set[str]:
    """Every format some backend reading the tensor-core layout (`reads` "mma") accepts on an H200."""
    import torch

    from b12x_core import backends
    from b12x_core.backends import DeviceInfo, MoEShape, Query

    h200 = DeviceInfo(torch.device("cuda", 0), (9, 0), sms=132, smem_kb=227)
    accepted = set()
    for fmt in bf.FORMATS:
        for cls in backends.REGISTRY:
            if "mma" not in cls.reads:
                continue
            moe = MoEShape(8, 256, 256, 2, "silu", "gate_up", "bf16", fmt) if cls.op == "moe" else None
            if cls.can_implement(Query(cls.op, fmt, "bf16", "bf16", h200, n=256, k=256, max_tokens=16, moe=moe))[0]:
                accepted.add(fmt)
    return accepted


def test_every_format_the_family_accepts_has_a_checked_repack_and_decode(rng):
    """A format listed in kernel_facts.LAYOUTS is accepted by the tensor-core backends (layout.FORMATS); it must
    also be one whose repack and lane decode this file checks (FORMATS), and pack and decode without error, or
    adding a name to LAYOUTS alone would let a backend take a format no repack or decode handles."""
    from b12x_formats.kernel_facts import SAME_LAYOUT

    accepted = _accepted_by_the_family()
    assert accepted >= set(mma_layout.FORMATS) - set(SAME_LAYOUT)  # the family takes every listed layout
    assert {SAME_LAYOUT.get(fmt, fmt) for fmt in accepted} <= set(FORMATS)
    for fmt in sorted(accepted):
        mw = mma_layout.pack(_weight(rng, fmt, 16, _k_multiple(fmt)))
        assert mma_layout.unpack(mw)["weight"].size
        effective_weight(mw, mma_layout.iq2_tables(fmt) if fmt.startswith("IQ2") else None)
