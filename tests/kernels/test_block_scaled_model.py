"""The NumPy model of SM12x's block-scaled mma.sync (b12x_kernels.block_scaled_mma), held to sources it shares no
code with:
- its fragment and scale tables to CUTLASS's CuTe layouts of the same instructions, copied here as data from
  cute/atom/mma_traits_sm120.hpp (and mma_traits_sm80.hpp, whose m16n8k32 layouts the SM120 traits reuse) and
  evaluated by a small CuTe layout function;
- its D to a float64 matmul of the logical matrices, decoded by ml_dtypes and packed into lanes by the CuTe layouts
  (the scales by the PTX ISA's selector rules, written out again here): bit for bit to the model's three-step
  definition computed this independent way, and within the fp32 rounding bound to the exact product.
A table with two lanes swapped fails these checks, which the last tests show."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from b12x_kernels import block_scaled_mma as bsm

INSTRUCTIONS = [
    bsm.NVFP4,
    bsm.MXF4,
    bsm.MXF4_4X,
    bsm.MXF8,
    bsm.MXF4_MXF8,
    bsm.mxf8f6f4(bsm.E4M3, bsm.E2M1),
    bsm.mxf8f6f4(bsm.E2M1, bsm.E2M1),
    bsm.mxf8f6f4(bsm.E3M2, bsm.E2M3),
    bsm.mxf8f6f4(bsm.E5M2, bsm.E2M1),
]


def _id(instr: bsm.BlockScaledMma) -> str:
    return f"{instr.kind}-{instr.atype.name}x{instr.btype.name}-{instr.stype.name}-{instr.scale_vec}X"


every_instruction = pytest.mark.parametrize("instr", INSTRUCTIONS, ids=_id)

# ---------------------------------------------------------------------------------------------------------------
# The second source: CuTe layouts (T32, V) -> column-major offset in (M, K) for A, (N, K) for B, (M, N) for C/D.

CUTE_A = {
    64: (((4, 8), (8, 2, 2)), ((128, 1), (16, 8, 512))),  # MMA_Traits<SM120_16x8x64_TN_VS>::ALayout
    32: (((4, 8), (4, 2, 2)), ((64, 1), (16, 8, 256))),  # SM80_16x8x32_S32S8S8S32_TN::ALayout
}
CUTE_B = {
    64: (((4, 8), (8, 2)), ((64, 1), (8, 256))),
    32: (((4, 8), (4, 2)), ((32, 1), (8, 128))),
}
CUTE_C = (((4, 8), (2, 2)), ((32, 1), (16, 8)))  # SM80_16x8_Row
CUTE_SFA = {k: (((2, 2, 8), k), ((8, 0, 1), 16)) for k in (64, 32)}  # (T32, V=K) -> (M16, K)
CUTE_SFB = {k: (((4, 8), k), ((0, 1), 8)) for k in (64, 32)}  # (T32, V=K) -> (N8, K)


def _size(shape) -> int:
    return shape if isinstance(shape, int) else math.prod(_size(s) for s in shape)


def _crd(idx, shape, stride):
    """CuTe's index -> offset: the index split colexicographically over the (nested) shape, dotted with stride."""
    if isinstance(shape, int):
        return idx * stride
    off = 0
    for s, d in zip(shape, stride, strict=True):
        off = off + _crd(idx % _size(s), s, d)
        idx = idx // _size(s)
    return off


def cute(layout, t, v):
    (tshape, vshape), (tstride, vstride) = layout
    return _crd(t, tshape, tstride) + _crd(v, vshape, vstride)


def cute_coords(layout, rows: int, nv: int):
    """(row, col) of value v of lane t, [32, nv] each, for a layout onto a column-major rows × cols target."""
    off = cute(layout, np.arange(32)[:, None], np.arange(nv)[None, :])
    return off % rows, off // rows


# The PTX ISA's element containers ("Multiply-and-Accumulate Instruction: mma"): (values per register, bits per
# value, offset of the code in its container).
def slot(instr, t):
    if instr.kind == "mxf4nvf4":
        return 8, 4, 0
    return 4, 8, 2 if t.name == "e2m1" else 0


def cute_pack_a(instr, codes):
    nv = 32 if instr.k == 64 else 16
    m, k = cute_coords(CUTE_A[instr.k], 16, nv)
    return _pack_values(codes[..., m, k], *slot(instr, instr.atype))


def cute_pack_b(instr, codes):
    nv = 16 if instr.k == 64 else 8
    n, k = cute_coords(CUTE_B[instr.k], 8, nv)
    return _pack_values(codes[..., k, n], *slot(instr, instr.btype))


def _pack_values(vals, per_reg, width, shift):
    out = np.zeros(vals.shape[:-1] + (vals.shape[-1] // per_reg,), dtype=np.uint64)
    for v in range(vals.shape[-1]):
        out[..., v // per_reg] |= vals[..., v].astype(np.uint64) << np.uint64(width * (v % per_reg) + shift)
    return out.astype(np.uint32)


def cute_pack_c(c):
    m, n = cute_coords(CUTE_C, 16, 4)
    return np.asarray(c, dtype=np.float32)[..., m, n]


def cute_unpack_c(regs):
    m, n = cute_coords(CUTE_C, 16, 4)
    out = np.full(regs.shape[:-2] + (16, 8), np.nan, dtype=np.float32)
    out[..., m, n] = regs
    return out


# The scale registers by the PTX ISA's words ("Block Scaling for mma.sync"): thread-id-a picks the lane pair
# lane % 4 in {2·tid, 2·tid + 1} of each quad, the lower lane for rows 0-7 (row = lane / 4), the upper for rows
# 8-15; thread-id-b the lane with lane % 4 == tid (column = lane / 4); block j sits in byte byte-id + j.
def ptx_pack_scales(codes, byte_id, thread_id, operand, junk):
    """codes [F, 16, nblk] (A) or [F, nblk, 8] (B), selectors [F] -> registers [F, 32]: `junk` where not read."""
    regs = junk.astype(np.uint64).copy()
    f = np.arange(codes.shape[0])
    if operand == "a":
        for m in range(16):
            lane = 4 * (m % 8) + 2 * thread_id + m // 8
            for j in range(codes.shape[-1]):
                _put_byte(regs, f, lane, byte_id + j, codes[:, m, j])
    else:
        for n in range(8):
            lane = 4 * n + thread_id
            for j in range(codes.shape[-2]):
                _put_byte(regs, f, lane, byte_id + j, codes[:, j, n])
    return regs.astype(np.uint32)


def _put_byte(regs, f, lane, byte, value):
    shift = (8 * byte).astype(np.uint64)
    regs[f, lane] = (regs[f, lane] & ~(np.uint64(0xFF) << shift)) | (value.astype(np.uint64) << shift)


# ---------------------------------------------------------------------------------------------------------------
# Decoding by ml_dtypes, not by the model's decoder

ML_DTYPES = {
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "ue8m0": ml_dtypes.float8_e8m0fnu,
    "ue4m3": ml_dtypes.float8_e4m3fn,  # a UE4M3 byte (top bit zero) means what the E4M3 byte does
}


def ml_decode(t, codes) -> np.ndarray:
    return np.asarray(codes, dtype=np.uint8).view(ML_DTYPES[t.name]).astype(np.float64)


def random_codes(t, shape, rng) -> np.ndarray:
    """Uniform codes of `t`, NaN and infinity codes moved to the largest finite magnitude."""
    codes = rng.integers(0, 1 << t.bits, size=shape)
    if t.name == "e4m3":
        codes = np.where(codes & 0x7F == 0x7F, codes ^ 1, codes)
    if t.name == "e5m2":
        codes = np.where(codes & 0x7C == 0x7C, codes & ~0x04, codes)
    return codes.astype(np.uint8)


def random_scales(t, shape, rng, spread: str) -> np.ndarray:
    """'typical': scales within 2^±40 of 1 (no result leaves fp32's normal range); 'full': every finite code."""
    if t.name == "ue8m0":
        lo, hi = (127 - 40, 127 + 40) if spread == "typical" else (0, 0xFF)
    else:
        lo, hi = (0x08, 0x7F) if spread == "typical" else (0, 0x7F)
    return rng.integers(lo, hi, size=shape).astype(np.uint8)


def random_c(rng, f) -> np.ndarray:
    c = rng.standard_normal((f, 16, 8)) * np.exp2(rng.integers(-30, 30, size=(f, 16, 8)))
    c[rng.random(c.shape) < 0.2] = 0.0
    return c.astype(np.float32)


def reference(instr, a, b, sa, sb, c):
    """The model's definition computed from the logical matrices: block sums by a float64 matmul (exact), scaled in
    float64 (exact), each rounded to fp32, added to C in K order in fp32. Also the exact result, and Σ|t|."""
    av, bv = ml_decode(instr.atype, a), ml_decode(instr.btype, b)
    sav, sbv = ml_decode(instr.stype, sa), ml_decode(instr.stype, sb)
    bs = instr.block
    d, exact, magnitude = c.copy(), c.astype(np.float64), np.abs(c.astype(np.float64))
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(instr.scale_vec):
            s = av[..., j * bs : (j + 1) * bs] @ bv[..., j * bs : (j + 1) * bs, :]
            t = s * sav[..., :, j : j + 1] * sbv[..., j : j + 1, :]
            d = d + t.astype(np.float32)
            exact = exact + t
            magnitude = magnitude + np.abs(t)
    return d, exact, magnitude


def fragments(instr, rng, f, spread="typical"):
    """f random fragments: logical codes, C, per-fragment selectors, and the lanes' registers packed from them by
    this file's packers, with random junk in the scale bytes and lanes the selectors do not pick."""
    nblk = instr.scale_vec
    x = dict(
        a=random_codes(instr.atype, (f, 16, instr.k), rng),
        b=random_codes(instr.btype, (f, instr.k, 8), rng),
        sa=random_scales(instr.stype, (f, 16, nblk), rng, spread),
        sb=random_scales(instr.stype, (f, nblk, 8), rng, spread),
        c=random_c(rng, f),
        bida=rng.choice(instr.byte_ids, size=f),
        tida=rng.choice(instr.thread_ids_a, size=f),
        bidb=rng.choice(instr.byte_ids, size=f),
        tidb=rng.choice(instr.thread_ids_b, size=f),
    )
    junk = rng.integers(0, 2**32, size=(2, f, 32), dtype=np.uint64)
    regs = dict(
        a=cute_pack_a(instr, x["a"]),
        b=cute_pack_b(instr, x["b"]),
        c=cute_pack_c(x["c"]),
        sfa=ptx_pack_scales(x["sa"], x["bida"], x["tida"], "a", junk[0]),
        sfb=ptx_pack_scales(x["sb"], x["bidb"], x["tidb"], "b", junk[1]),
        byte_id_a=x["bida"],
        thread_id_a=x["tida"],
        byte_id_b=x["bidb"],
        thread_id_b=x["tidb"],
    )
    return x, regs


def check_model(instr, rng, f=24, spread="typical"):
    x, regs = fragments(instr, rng, f, spread)
    d = cute_unpack_c(bsm.mma(instr, **regs))
    want, exact, magnitude = reference(instr, x["a"], x["b"], x["sa"], x["sb"], x["c"])
    np.testing.assert_array_equal(d, want, err_msg=f"{instr}: the model against its definition")
    # against the exact product: 2·nblk roundings to fp32 (each block's scaled sum, each addition), each within half
    # an ulp of a value no larger than 2·(|C| + Σ|t|), plus half the smallest subnormal each
    nblk = instr.scale_vec
    bound = 2 * (nblk + 1) * 2.0**-24 * magnitude + 2 * nblk * 2.0**-150
    finite = np.isfinite(d)
    assert finite[magnitude < 2.0**126].all()
    err = np.abs(d[finite].astype(np.float64) - exact[finite])
    assert (err <= bound[finite]).all(), f"{instr}: off by {np.max(err / np.maximum(bound[finite], 1e-300))} bounds"


# ---------------------------------------------------------------------------------------------------------------
# Tables


def test_decoders_agree_with_ml_dtypes():
    for t in (bsm.E2M1, bsm.E3M2, bsm.E2M3, bsm.E4M3, bsm.E5M2, bsm.UE8M0, bsm.UE4M3):
        codes = np.arange(1 << t.bits)
        np.testing.assert_array_equal(bsm.decode(t, codes), ml_decode(t, codes), err_msg=t.name)
        signs = np.signbit(bsm.decode(t, codes)) == np.signbit(ml_decode(t, codes))
        assert signs[~np.isnan(ml_decode(t, codes))].all(), t.name


@pytest.mark.parametrize("k", [64, 32])
def test_fragment_tables_agree_with_cute(k):
    tables = bsm.FRAGMENTS[k]
    for name, layout, rows, nv in (("a", CUTE_A[k], 16, k // 2), ("b", CUTE_B[k], 8, k // 4)):
        r, c = cute_coords(layout, rows, nv)
        if name == "b":  # CuTe's B is (N, K); the table's is (K, N)
            r, c = c, r
        np.testing.assert_array_equal(tables[name].rows, r, err_msg=f"m16n8k{k} {name} rows")
        np.testing.assert_array_equal(tables[name].cols, c, err_msg=f"m16n8k{k} {name} cols")
    m, n = cute_coords(CUTE_C, 16, 4)
    np.testing.assert_array_equal(tables["c"].rows, m)
    np.testing.assert_array_equal(tables["c"].cols, n)


@pytest.mark.parametrize("k", [64, 32])
def test_scale_lanes_agree_with_cute(k):
    """CuTe's scale layouts encode thread-id = 0, the lanes 2 and 3 of each quad (its stride-0 mode) as replicas of
    lanes 0 and 1: those are the thread-id-a = 1 lanes of the table. Value v of every lane is column v of K."""
    lanes, v = np.arange(32)[:, None], np.arange(k)[None, :]
    off = cute(CUTE_SFA[k], lanes, v)
    assert (off == off[:, :1] + 16 * v).all()
    for lane in range(32):
        m = int(off[lane, 0])
        assert bsm.SCALE_A_LANE[(lane % 4) // 2, m] == lane
    off = cute(CUTE_SFB[k], lanes, v)
    assert (off == off[:, :1] + 8 * v).all()
    for lane in range(32):
        assert bsm.SCALE_B_LANE[lane % 4, int(off[lane, 0])] == lane


@every_instruction
def test_tables_are_bijections(instr):
    """Every element of A, B and C/D is held by exactly one (lane, element); every scale of scale_A and scale_B by
    exactly one (lane, byte), for every selector of Table 40."""
    for name, shape in (("a", (16, instr.k)), ("b", (instr.k, 8)), ("c", (16, 8))):
        t = bsm.FRAGMENTS[instr.k][name]
        flat = np.sort((t.rows * shape[1] + t.cols).ravel())
        np.testing.assert_array_equal(flat, np.arange(shape[0] * shape[1]), err_msg=name)
    j = np.arange(instr.scale_vec)
    for bid in instr.byte_ids:
        for tid in instr.thread_ids_a:
            where = bsm.SCALE_A_LANE[tid][:, None] * 4 + bid + j  # (lane, byte) of scale_A[m, j]
            assert np.unique(where).size == 16 * instr.scale_vec and (bid + j < 4).all()
        for tid in instr.thread_ids_b:
            where = bsm.SCALE_B_LANE[tid][None, :] * 4 + bid + j[:, None]
            assert np.unique(where).size == 8 * instr.scale_vec


@every_instruction
def test_pack_helpers_round_trip_and_match_cute(instr, rng):
    x, regs = fragments(instr, rng, 8)
    a, b = bsm.pack_a(instr, x["a"]), bsm.pack_b(instr, x["b"])
    np.testing.assert_array_equal(a, regs["a"])
    np.testing.assert_array_equal(b, regs["b"])
    np.testing.assert_array_equal(bsm.unpack_a(instr, a), x["a"])
    np.testing.assert_array_equal(bsm.unpack_b(instr, b), x["b"])
    np.testing.assert_array_equal(bsm.pack_c(instr, x["c"]), regs["c"])
    np.testing.assert_array_equal(bsm.unpack_d(instr, regs["c"]), x["c"])
    sfa = bsm.pack_scales_a(instr, x["sa"], x["bida"], x["tida"])
    sfb = bsm.pack_scales_b(instr, x["sb"], x["bidb"], x["tidb"])
    zero = np.zeros((2, 8, 32), dtype=np.uint64)
    np.testing.assert_array_equal(sfa, ptx_pack_scales(x["sa"], x["bida"], x["tida"], "a", zero[0]))
    np.testing.assert_array_equal(sfb, ptx_pack_scales(x["sb"], x["bidb"], x["tidb"], "b", zero[1]))
    np.testing.assert_array_equal(bsm.read_scales_a(instr, regs["sfa"], x["bida"], x["tida"]), x["sa"])
    np.testing.assert_array_equal(bsm.read_scales_b(instr, regs["sfb"], x["bidb"], x["tidb"]), x["sb"])


# ---------------------------------------------------------------------------------------------------------------
# The model


@every_instruction
@pytest.mark.parametrize("spread", ["typical", "full"])
def test_model_matches_float64_matmul(instr, rng, spread):
    """Random fragments, scale bytes (all finite codes under 'full': results overflow to infinity and round into
    subnormals), selectors and C."""
    check_model(instr, rng, spread=spread)


@every_instruction
def test_model_is_exact_where_the_math_is(instr, rng):
    """One rounding only: scale_vec::1X with C = 0 (D is the scaled block sum rounded once), and for the wider
    scale vectors unit scales with C and every partial sum exact in fp32 (small multiples of 1/4): D is exact."""
    x, regs = fragments(instr, rng, 16)
    if instr.scale_vec == 1:
        c = np.zeros((16, 16, 8), dtype=np.float32)
    else:
        unit = 127 if instr.stype == bsm.UE8M0 else 0x38
        x["sa"][:], x["sb"][:] = unit, unit
        c = (rng.integers(-4000, 4000, size=(16, 16, 8)) / 4).astype(np.float32)
        regs["sfa"] = ptx_pack_scales(x["sa"], x["bida"], x["tida"], "a", np.zeros((16, 32), np.uint64))
        regs["sfb"] = ptx_pack_scales(x["sb"], x["bidb"], x["tidb"], "b", np.zeros((16, 32), np.uint64))
    regs["c"] = cute_pack_c(c)
    d = cute_unpack_c(bsm.mma(instr, **regs))
    _, exact, _ = reference(instr, x["a"], x["b"], x["sa"], x["sb"], c)
    np.testing.assert_array_equal(d, exact.astype(np.float32))
    if instr.scale_vec > 1:
        np.testing.assert_array_equal(d.astype(np.float64), exact)


@pytest.mark.parametrize("instr", [bsm.NVFP4, bsm.MXF4, bsm.MXF8], ids=_id)
def test_nan_scales_and_elements_poison_their_row_or_column(instr, rng):
    x, regs = fragments(instr, rng, 4)
    clean = cute_unpack_c(bsm.mma(instr, **regs))
    nan_scale = 0x7F if instr.stype == bsm.UE4M3 else 0xFF
    x["sa"][0, 3, instr.scale_vec - 1] = nan_scale  # fragment 0: row 3's last block
    x["sb"][1, 0, 5] = nan_scale  # fragment 1: column 5's first block
    junk = np.zeros((4, 32), np.uint64)
    regs["sfa"] = ptx_pack_scales(x["sa"], x["bida"], x["tida"], "a", junk)
    regs["sfb"] = ptx_pack_scales(x["sb"], x["bidb"], x["tidb"], "b", junk)
    if instr.atype == bsm.E4M3:
        x["a"][2, 7, 10] = 0xFF  # fragment 2: an E4M3 NaN in row 7
        regs["a"] = cute_pack_a(instr, x["a"])
    d = cute_unpack_c(bsm.mma(instr, **regs))
    poisoned = np.zeros(d.shape, dtype=bool)
    poisoned[0, 3, :] = poisoned[1, :, 5] = True
    if instr.atype == bsm.E4M3:
        poisoned[2, 7, :] = True
    assert np.isnan(d[poisoned]).all()
    np.testing.assert_array_equal(d[~poisoned], clean[~poisoned])
    np.testing.assert_array_equal(d, reference(instr, x["a"], x["b"], x["sa"], x["sb"], x["c"])[0])


def test_inputs_the_ptx_isa_leaves_undefined_are_refused(rng):
    x, regs = fragments(bsm.MXF4_MXF8, rng, 2)
    bad = regs["a"].copy()
    bad[1, 5, 2] |= 1  # a padding bit below an e2m1 in its 8-bit container
    with pytest.raises(ValueError, match="padding"):
        bsm.mma(bsm.MXF4_MXF8, **{**regs, "a": bad})
    fp6 = bsm.mxf8f6f4(bsm.E3M2, bsm.E2M3)
    _, regs6 = fragments(fp6, rng, 2)
    regs6["b"][0, 9, 1] |= 0x80
    with pytest.raises(ValueError, match="padding"):
        bsm.mma(fp6, **regs6)
    _, regs4 = fragments(bsm.NVFP4, rng, 1)
    sfa = regs4["sfa"].copy()
    lane = bsm.SCALE_A_LANE[regs4["thread_id_a"][0], 0]
    sfa[0, lane] |= 0x80  # the top bit of a read UE4M3 byte
    with pytest.raises(ValueError, match="ue4m3"):
        bsm.mma(bsm.NVFP4, **{**regs4, "sfa": sfa})
    unread = np.arange(32)[~np.isin(np.arange(32), bsm.SCALE_A_LANE[regs4["thread_id_a"][0]])]
    sfa = regs4["sfa"].copy()
    sfa[0, unread] |= 0x80808080  # bytes of lanes it does not read: ignored
    bsm.mma(bsm.NVFP4, **{**regs4, "sfa": sfa})
    with pytest.raises(ValueError, match="byte-id-a"):
        bsm.mma(bsm.MXF4, **{**fragments(bsm.MXF4, rng, 1)[1], "byte_id_a": 1})
    with pytest.raises(ValueError, match="thread-id-a"):
        bsm.mma(bsm.MXF8, **{**fragments(bsm.MXF8, rng, 1)[1], "thread_id_a": 2})
    with pytest.raises(ValueError, match="Table 39"):
        bsm.BlockScaledMma("mxf8f6f4", bsm.E4M3, bsm.E4M3, bsm.UE4M3, 1)
    with pytest.raises(ValueError, match="Table 39"):
        bsm.BlockScaledMma("mxf4nvf4", bsm.E2M1, bsm.E2M1, bsm.UE4M3, 2)
    with pytest.raises(NotImplementedError, match="significant bits"):
        bsm.mxf8f6f4(bsm.E5M2, bsm.E4M3)


# ---------------------------------------------------------------------------------------------------------------
# The checks can fail


def _swap_lanes(table: bsm.Fragment, l0: int, l1: int) -> bsm.Fragment:
    rows, cols = table.rows.copy(), table.cols.copy()
    rows[[l0, l1]], cols[[l0, l1]] = rows[[l1, l0]], cols[[l1, l0]]
    return bsm.Fragment(rows, cols)


@pytest.mark.parametrize("which", ["a", "b", "c", "scale_a", "scale_b"])
@pytest.mark.parametrize("instr", [bsm.NVFP4, bsm.MXF8], ids=_id)
def test_a_swapped_lane_in_a_table_fails_the_check(instr, rng, monkeypatch, which):
    if which in ("a", "b", "c"):
        monkeypatch.setitem(bsm.FRAGMENTS[instr.k], which, _swap_lanes(bsm.FRAGMENTS[instr.k][which], 0, 1))
    else:
        name = "SCALE_A_LANE" if which == "scale_a" else "SCALE_B_LANE"
        lanes = getattr(bsm, name).copy()
        lanes[:, [0, 1]] = lanes[:, [1, 0]]  # two rows (columns) of the scale matrix trade lanes
        monkeypatch.setattr(bsm, name, lanes)
    with pytest.raises(AssertionError):
        check_model(instr, rng)
