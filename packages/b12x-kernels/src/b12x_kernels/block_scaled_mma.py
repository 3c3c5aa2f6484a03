"""SM120/SM121's block-scaled `mma.sync`, written down as data, and an exact NumPy model of the instruction.

The instructions (PTX ISA, "Multiply-and-Accumulate Instruction: mma", the "Alternate floating point type with block
scaling" forms; they need sm_120a / sm_121a):

    mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::{2X|4X}.f32.e2m1.e2m1.f32.{ue8m0|ue4m3}
    mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.atype.btype.f32.ue8m0
        d, a, b, c, scale-a-data, {byte-id-a, thread-id-a}, scale-b-data, {byte-id-b, thread-id-b};

compute D = (A * scale_A) (B * scale_B) + C for A 16×K, B K×8, C and D 16×8 in fp32, where scale_A is 16 × (K/block)
and scale_B is (K/block) × 8: each row of A and each column of B is cut into `scale_vec` blocks along K, and block j
is multiplied by the scale in column j of scale_A (row j of scale_B) ("Block Scaling for mma.sync").

Where the tables come from (section titles of the PTX ISA; their numbers move between versions):
- "Matrix Fragments for mma.m16n8k64" (.e2m1, Figures 93-96) and "Matrix Fragments for mma.m16n8k32"
  (.e4m3 / .e5m2 / .e3m2 / .e2m3 / .e2m1, Figures 88, 90-92): which lane holds which element of A, B and C/D,
  written below as the row/column formulas those sections give, elements numbered "low to high" in each register.
- "Multiply-and-Accumulate Instruction: mma": under .kind::mxf8f6f4 every element sits in an 8-bit container, an
  .e2m1 in its central 4 bits (2 padding bits above and below), an .e3m2 / .e2m3 in its low 6 bits; under
  .kind::mxf4nvf4 the .e2m1 elements are packed 8 to a register with no padding.
- "Block Scaling for mma.sync" (Tables 38-40, Figures 43-45): thread-id-a picks the lane pair of each quad that
  supplies scale_A (lane % 4 == 2·thread-id-a for rows 0-7, 2·thread-id-a + 1 for rows 8-15, row = lane / 4 (+ 8)),
  thread-id-b the one lane of each quad that supplies scale_B (lane % 4 == thread-id-b, column = lane / 4); byte-id
  selects the byte (1X), the byte pair starting at byte-id (2X) or all four bytes (4X) of the 32-bit scale register,
  byte byte-id + j holding the scale of block j. The text names the lane pair and the bytes; which lane of the pair
  holds rows 0-7 and which byte holds block 0 are the figures', read here as CUTLASS's SFALayout encodes them.
- "Alternate Floating-Point Data Formats": e2m1, e3m2, e2m3, e4m3 (NaN 0x7f/0xff, no infinity), e5m2 (IEEE-like),
  ue8m0 (2^(code-127), NaN 0xff) and ue4m3 (7 bits, the register's top bit padded with zero, NaN 0x7f).
The same layouts are encoded as CuTe layouts in CUTLASS (cute/atom/mma_traits_sm120.hpp, whose A/B/C layouts for
m16n8k32 are SM80_16x8x32_S32S8S8S32_TN's in mma_traits_sm80.hpp); tests/kernels/test_block_scaled_model.py
evaluates those and checks that both sources agree lane by lane. CUTLASS always issues thread-id = byte-id = 0; the
other selector values rest on the PTX text alone.

The model's arithmetic. The PTX ISA ("Precision and rounding") leaves it open: element products are formed "with
specified precision", accumulation is "at least single precision", and "the accumulation order, rounding, and
handling of subnormal inputs are unspecified". The model fixes one definition, exact except for fp32 roundings at
named places (RN below: round to nearest even, subnormals kept, overflow to infinity):
  1. s[m, n, j] = sum over k in block j of A[m, k] · B[k, n], exactly;
  2. t[m, n, j] = RN_fp32(s[m, n, j] · SF_A[m, j] · SF_B[j, n]): each block's scaled sum rounded once to fp32;
  3. D[m, n] = RN_fp32(... RN_fp32(RN_fp32(C[m, n] + t[m, n, 0]) + t[m, n, 1]) ... + t[m, n, nblk - 1]):
     the blocks added to C one at a time, in K order, each addition rounded to fp32.
Steps 1 and 2 are computed exactly in float64: each supported type pair is checked at construction to need at most
53 significant bits (e4m3 × e4m3 over 32 elements needs 41; E8M0 scales are powers of two; an e2m1 block sum times
two UE4M3 scales needs 20). For NVFP4 (e2m1, UE4M3 scales) step 2 never rounds, so only the additions do; for
scale_vec::1X step 3 is a single addition. NaN and infinity propagate as IEEE arithmetic does (a NaN scale makes its
row or column of D NaN), and so do signed zeros. Why this definition: it is the instruction's mathematics with few
roundings, each of which a kernel on Hopper can reproduce bit for bit (block sums in fp64, one fp64 -> fp32
conversion, fp32 adds), and its steps follow the structure the instruction exposes, one scale per block. The
hardware may round elsewhere (one wide sum over all blocks: then D differs from this model within the fp32 rounding
bound) or keep fewer bits (as Hopper's FP8 wgmma accumulator is reported to: then by more). What it does stays
unverified until an SM12x GPU runs the self-test.

Inputs whose meaning the PTX ISA leaves undefined are refused (ValueError), not given one: nonzero padding bits in
the element containers, a UE4M3 scale byte with its top bit set, selectors outside Table 40. Bytes and lanes of the
scale registers that the selectors do not pick are ignored: the PTX ISA says only the selected ones contribute.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

LANES = 32
M = 16
N = 8


# ---------------------------------------------------------------------------------------------------------------
# Element and scale types ("Alternate Floating-Point Data Formats")


@dataclass(frozen=True)
class ElementType:
    """A PTX element or scale type: `exp_bits` and `man_bits` over `bias`, a sign bit on top when `signed`. `nan`:
    the codes (sign bit clear) that mean NaN, of either sign; `ieee_specials`: the all-ones exponent means infinity
    (mantissa 0) or NaN, as in e5m2; `no_subnormals`: every exponent, 0 included, is 2^(e - bias) (ue8m0)."""

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    signed: bool = True
    nan: tuple[int, ...] = ()
    ieee_specials: bool = False
    no_subnormals: bool = False

    @property
    def bits(self) -> int:
        return int(self.signed) + self.exp_bits + self.man_bits


E2M1 = ElementType("e2m1", 2, 1, 1)
E3M2 = ElementType("e3m2", 3, 2, 3)
E2M3 = ElementType("e2m3", 2, 3, 1)
E4M3 = ElementType("e4m3", 4, 3, 7, nan=(0x7F,))
E5M2 = ElementType("e5m2", 5, 2, 15, ieee_specials=True)
UE8M0 = ElementType("ue8m0", 8, 0, 127, signed=False, nan=(0xFF,), no_subnormals=True)
UE4M3 = ElementType("ue4m3", 4, 3, 7, signed=False, nan=(0x7F,))

F8F6F4_TYPES = (E4M3, E5M2, E3M2, E2M3, E2M1)


@functools.cache
def _lut(t: ElementType) -> np.ndarray:
    """Every code of `t` -> its float64 value, from the bit fields (exact: at most 8 significant bits)."""
    codes = np.arange(1 << t.bits)
    man = codes & ((1 << t.man_bits) - 1)
    exp = (codes >> t.man_bits) & ((1 << t.exp_bits) - 1)
    if t.no_subnormals:
        mag = np.ldexp(1.0, exp - t.bias)
    else:
        subnormal = np.ldexp(man.astype(np.float64), 1 - t.bias - t.man_bits)
        normal = np.ldexp((man + (1 << t.man_bits)).astype(np.float64), exp - t.bias - t.man_bits)
        mag = np.where(exp == 0, subnormal, normal)
    if t.ieee_specials:
        top = exp == (1 << t.exp_bits) - 1
        mag = np.where(top, np.where(man == 0, np.inf, np.nan), mag)
    magnitude_code = codes & ((1 << (t.exp_bits + t.man_bits)) - 1)
    mag = np.where(np.isin(magnitude_code, t.nan), np.nan, mag)
    negative = (codes >> (t.exp_bits + t.man_bits)) & 1 if t.signed else np.zeros_like(codes)
    lut = np.where(negative == 1, -mag, mag)
    lut.flags.writeable = False
    return lut


def decode(t: ElementType, codes) -> np.ndarray:
    """Codes of type `t` (integers below 2^t.bits) -> float64 values."""
    return _lut(t)[np.asarray(codes, dtype=np.int64)]


def _finite_range(t: ElementType) -> tuple[float, float]:
    """(smallest positive value, largest finite value) of `t`: both powers of two or exact."""
    values = np.abs(_lut(t))
    values = values[np.isfinite(values) & (values > 0)]
    return float(values.min()), float(values.max())


# ---------------------------------------------------------------------------------------------------------------
# Fragment tables ("Matrix Fragments for mma.m16n8k64" / "... for mma.m16n8k32"; groupID = lane >> 2,
# threadID_in_group = lane % 4). rows[lane, i], cols[lane, i]: the matrix element that element i of the lane holds.


class Fragment(NamedTuple):
    rows: np.ndarray  # [32, elements per lane]
    cols: np.ndarray


def _lane_element(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lane = np.arange(LANES)[:, None]
    return lane >> 2, lane % 4, np.arange(n)[None, :]


def _k64_a() -> Fragment:  # .e2m1, four .b32 registers of eight elements: a0 .. a31
    g, t, i = _lane_element(32)
    row = np.where((i < 8) | ((16 <= i) & (i < 24)), g, g + 8)
    col = np.where(i < 16, t * 8 + (i & 7), t * 8 + (i & 7) + 32)
    return Fragment(row, col)


def _k64_b() -> Fragment:  # .e2m1, two .b32 registers of eight elements: b0 .. b15
    g, t, i = _lane_element(16)
    row = np.where(i < 8, t * 8 + (i & 7), t * 8 + (i & 7) + 32)
    return Fragment(row, np.broadcast_to(g, row.shape))


def _k32_a() -> Fragment:  # 8-bit containers, four .b32 registers of four elements: a0 .. a15
    g, t, i = _lane_element(16)
    row = np.where((i < 4) | ((8 <= i) & (i < 12)), g, g + 8)
    col = np.where(i < 8, t * 4 + (i & 3), t * 4 + (i & 3) + 16)
    return Fragment(row, col)


def _k32_b() -> Fragment:  # 8-bit containers, two .b32 registers of four elements: b0 .. b7
    g, t, i = _lane_element(8)
    row = np.where(i < 4, t * 4 + (i & 3), t * 4 + (i & 3) + 16)
    return Fragment(row, np.broadcast_to(g, row.shape))


def _cd() -> Fragment:  # .f32 accumulators, four registers: c0 .. c3 (the same for both shapes)
    g, t, i = _lane_element(4)
    row = np.where(i < 2, g, g + 8)
    col = t * 2 + (i & 1)
    return Fragment(row, col)


def _frozen(f: Fragment) -> Fragment:
    out = Fragment(np.ascontiguousarray(f.rows), np.ascontiguousarray(f.cols))
    for a in out:
        a.flags.writeable = False
    return out


# FRAGMENTS[K]["a" | "b" | "c"]: the tables of m16n8k64 (K = 64) and m16n8k32 (K = 32); "c" serves C and D.
FRAGMENTS = {
    64: {"a": _frozen(_k64_a()), "b": _frozen(_k64_b()), "c": _frozen(_cd())},
    32: {"a": _frozen(_k32_a()), "b": _frozen(_k32_b()), "c": _frozen(_cd())},
}

# Scale lanes ("Block Scaling for mma.sync"): SCALE_A_LANE[thread-id-a, m] is the lane whose scale-a-data holds row
# m of scale_A; SCALE_B_LANE[thread-id-b, n] the lane whose scale-b-data holds column n of scale_B. In that register,
# byte byte-id + j holds block j.
_m = np.arange(M)
SCALE_A_LANE = np.stack([4 * (_m % 8) + 2 * tid + _m // 8 for tid in (0, 1)])
_n = np.arange(N)
SCALE_B_LANE = np.stack([4 * _n + tid for tid in (0, 1, 2, 3)])
SCALE_A_LANE.flags.writeable = False
SCALE_B_LANE.flags.writeable = False
del _m, _n


class Slot(NamedTuple):
    """Where an element's code sits: `per_reg` slots of `width` bits per register, low to high; the code's `bits`
    start `shift` bits into its slot; the slot's other bits are padding."""

    per_reg: int
    width: int
    shift: int
    bits: int


# ---------------------------------------------------------------------------------------------------------------
# The instructions ("Block Scaling for mma.sync", Table 39; Table 40 for the selectors)


@dataclass(frozen=True)
class BlockScaledMma:
    """One block-scaled mma.sync: .kind, .atype, .btype, .stype and .scale_vec_size (1, 2 or 4)."""

    kind: str
    atype: ElementType
    btype: ElementType
    stype: ElementType
    scale_vec: int

    def __post_init__(self):
        if self.kind == "mxf4nvf4":
            types_ok = self.atype == self.btype == E2M1
            ok = types_ok and (self.stype, self.scale_vec) in ((UE8M0, 2), (UE8M0, 4), (UE4M3, 4))
        elif self.kind == "mxf8f6f4":
            types_ok = self.atype in F8F6F4_TYPES and self.btype in F8F6F4_TYPES
            ok = types_ok and (self.stype, self.scale_vec) == (UE8M0, 1)
        else:
            ok = False
        if not ok:
            raise ValueError(f"not a combination of Table 39: {self}")
        (qa, ma), (qb, mb) = _finite_range(self.atype), _finite_range(self.btype)
        significand = (1 << (self.stype.man_bits + 1)) - 1  # a scale's largest significand, an integer
        bits = math.log2(self.block * ma * mb / (qa * qb) * significand**2)
        if bits > 53:
            raise NotImplementedError(
                f"{self.atype.name} x {self.btype.name}: a scaled block sum needs {bits:.1f} significant bits, more"
                " than float64 holds exactly; the model does not define it"
            )

    @property
    def k(self) -> int:
        return 64 if self.kind == "mxf4nvf4" else 32

    @property
    def block(self) -> int:
        """Elements of K that share one scale."""
        return self.k // self.scale_vec

    @property
    def byte_ids(self) -> tuple[int, ...]:
        return {1: (0, 1, 2, 3), 2: (0, 2), 4: (0,)}[self.scale_vec]

    thread_ids_a = (0, 1)
    thread_ids_b = (0, 1, 2, 3)

    @property
    def ptx(self) -> str:
        return (
            f"mma.sync.aligned.m16n8k{self.k}.row.col.kind::{self.kind}.block_scale.scale_vec::{self.scale_vec}X"
            f".f32.{self.atype.name}.{self.btype.name}.f32.{self.stype.name}"
        )

    def slot(self, t: ElementType) -> Slot:
        if self.kind == "mxf4nvf4":
            return Slot(8, 4, 0, 4)
        return Slot(4, 8, 2 if t == E2M1 else 0, t.bits)

    @property
    def a_slot(self) -> Slot:
        return self.slot(self.atype)

    @property
    def b_slot(self) -> Slot:
        return self.slot(self.btype)

    def __str__(self) -> str:
        return self.ptx


NVFP4 = BlockScaledMma("mxf4nvf4", E2M1, E2M1, UE4M3, 4)  # E4M3 (ue4m3) scale per 16 elements
MXF4 = BlockScaledMma("mxf4nvf4", E2M1, E2M1, UE8M0, 2)  # E8M0 scale per 32 elements (as .kind::mxf4)
MXF4_4X = BlockScaledMma("mxf4nvf4", E2M1, E2M1, UE8M0, 4)  # E8M0 scale per 16 elements (PTX ISA 9.1)


def mxf8f6f4(atype: ElementType, btype: ElementType) -> BlockScaledMma:
    """The m16n8k32 .kind::mxf8f6f4 instruction: E8M0 scale per 32 elements."""
    return BlockScaledMma("mxf8f6f4", atype, btype, UE8M0, 1)


MXF8 = mxf8f6f4(E4M3, E4M3)
MXF4_MXF8 = mxf8f6f4(E2M1, E4M3)


# ---------------------------------------------------------------------------------------------------------------
# Packing: logical matrices of codes <-> the 32 lanes' registers


def _pack(codes: np.ndarray, frag: Fragment, slot: Slot) -> np.ndarray:
    vals = np.asarray(codes).astype(np.int64)[..., frag.rows, frag.cols]  # [..., 32, n]
    if (vals < 0).any() or (vals >= 1 << slot.bits).any():
        raise ValueError(f"codes must be {slot.bits}-bit")
    n = frag.rows.shape[1]
    pos = slot.width * (np.arange(n) % slot.per_reg) + slot.shift
    words = (vals << pos).reshape(*vals.shape[:-1], n // slot.per_reg, slot.per_reg).sum(-1)  # disjoint bits
    return words.astype(np.uint32)


def _unpack(regs: np.ndarray, frag: Fragment, slot: Slot, shape: tuple[int, int], what: str) -> np.ndarray:
    regs = np.asarray(regs)
    n = frag.rows.shape[1]
    if regs.shape[-2:] != (LANES, n // slot.per_reg):
        raise ValueError(f"{what}: expected [..., {LANES}, {n // slot.per_reg}] registers, got {regs.shape}")
    i = np.arange(n)
    field = (regs.astype(np.int64)[..., i // slot.per_reg] >> (slot.width * (i % slot.per_reg))) & (
        (1 << slot.width) - 1
    )
    code_mask = (1 << slot.bits) - 1
    if (field & ~(code_mask << slot.shift)).any():
        raise ValueError(f"{what}: nonzero padding bits in an element container (undefined in the PTX ISA)")
    out = np.zeros(regs.shape[:-2] + shape, dtype=np.uint8)
    out[..., frag.rows, frag.cols] = (field >> slot.shift) & code_mask
    return out


def pack_a(instr: BlockScaledMma, codes) -> np.ndarray:
    """A's codes [..., 16, K] -> registers [..., 32, 4] (uint32)."""
    return _pack(codes, FRAGMENTS[instr.k]["a"], instr.a_slot)


def unpack_a(instr: BlockScaledMma, regs) -> np.ndarray:
    """Registers [..., 32, 4] -> A's codes [..., 16, K] (uint8)."""
    return _unpack(regs, FRAGMENTS[instr.k]["a"], instr.a_slot, (M, instr.k), "A")


def pack_b(instr: BlockScaledMma, codes) -> np.ndarray:
    """B's codes [..., K, 8] -> registers [..., 32, 2] (uint32)."""
    return _pack(codes, FRAGMENTS[instr.k]["b"], instr.b_slot)


def unpack_b(instr: BlockScaledMma, regs) -> np.ndarray:
    """Registers [..., 32, 2] -> B's codes [..., K, 8] (uint8)."""
    return _unpack(regs, FRAGMENTS[instr.k]["b"], instr.b_slot, (instr.k, N), "B")


def pack_c(instr: BlockScaledMma, c) -> np.ndarray:
    """C (or D) [..., 16, 8] -> registers [..., 32, 4] (float32)."""
    frag = FRAGMENTS[instr.k]["c"]
    return np.asarray(c, dtype=np.float32)[..., frag.rows, frag.cols]


def unpack_c(instr: BlockScaledMma, regs) -> np.ndarray:
    """Registers [..., 32, 4] (float32) -> C (or D) [..., 16, 8]."""
    regs = np.asarray(regs, dtype=np.float32)
    if regs.shape[-2:] != (LANES, 4):
        raise ValueError(f"C/D: expected [..., 32, 4] registers, got {regs.shape}")
    frag = FRAGMENTS[instr.k]["c"]
    out = np.empty(regs.shape[:-2] + (M, N), dtype=np.float32)
    out[..., frag.rows, frag.cols] = regs
    return out


unpack_d = unpack_c


def _selectors(instr: BlockScaledMma, byte_id, thread_id, thread_ids, what: str):
    byte_id, thread_id = np.asarray(byte_id, dtype=np.int64), np.asarray(thread_id, dtype=np.int64)
    if not np.isin(byte_id, instr.byte_ids).all():
        raise ValueError(f"byte-id-{what} must be one of {instr.byte_ids} for scale_vec::{instr.scale_vec}X (Table 40)")
    if not np.isin(thread_id, thread_ids).all():
        raise ValueError(f"thread-id-{what} must be one of {thread_ids} (Table 40)")
    return byte_id, thread_id


def _check_scale_codes(instr: BlockScaledMma, codes: np.ndarray) -> None:
    if instr.stype == UE4M3 and (codes & 0x80).any():
        raise ValueError("a ue4m3 scale byte with its top bit set (the PTX ISA pads it with zero)")


def read_scales_a(instr: BlockScaledMma, sfa, byte_id_a=0, thread_id_a=0) -> np.ndarray:
    """scale-a-data registers [..., 32] and the selectors -> scale_A's codes [..., 16, K/block] (uint8)."""
    return _read_scales(instr, sfa, byte_id_a, thread_id_a, "a")


def read_scales_b(instr: BlockScaledMma, sfb, byte_id_b=0, thread_id_b=0) -> np.ndarray:
    """scale-b-data registers [..., 32] and the selectors -> scale_B's codes [..., K/block, 8] (uint8)."""
    return np.ascontiguousarray(np.swapaxes(_read_scales(instr, sfb, byte_id_b, thread_id_b, "b"), -1, -2))


def _read_scales(instr: BlockScaledMma, regs, byte_id, thread_id, side: str) -> np.ndarray:
    """One side's scale codes [..., rows of A or columns of B, K/block]: each row's (column's) word is read from the
    lane the selectors name, its blocks from byte byte-id on."""
    table, count, ids = (SCALE_A_LANE, M, instr.thread_ids_a) if side == "a" else (SCALE_B_LANE, N, instr.thread_ids_b)
    byte_id, tid = _selectors(instr, byte_id, thread_id, ids, side)
    regs = np.asarray(regs).astype(np.int64)
    batch = np.broadcast_shapes(regs.shape[:-1], byte_id.shape, tid.shape)
    lanes = np.broadcast_to(table[tid], batch + (count,))
    words = np.take_along_axis(np.broadcast_to(regs, batch + (LANES,)), lanes, axis=-1)  # [..., count]
    shift = 8 * (byte_id[..., None, None] + np.arange(instr.scale_vec))  # [..., 1, nblk]
    codes = ((words[..., :, None] >> shift) & 0xFF).astype(np.uint8)
    _check_scale_codes(instr, codes)
    return codes


def _pack_scales(codes, lanes, byte_id, nblk: int, j_axis: int) -> np.ndarray:
    codes = np.asarray(codes).astype(np.int64)
    if (codes < 0).any() or (codes > 0xFF).any():
        raise ValueError("scale codes must be bytes")
    shift = 8 * (np.expand_dims(byte_id, (-1, -2)) + np.expand_dims(np.arange(nblk), -1 - j_axis))
    words = (codes << shift).sum(axis=j_axis)  # one word per row of scale_A / column of scale_B
    batch = np.broadcast_shapes(words.shape[:-1], lanes.shape[:-1])
    out = np.zeros(batch + (LANES,), dtype=np.int64)
    lanes, words = np.broadcast_to(lanes, batch + lanes.shape[-1:]), np.broadcast_to(words, batch + words.shape[-1:])
    np.put_along_axis(out, lanes, words, axis=-1)
    return out.astype(np.uint32)


def pack_scales_a(instr: BlockScaledMma, codes, byte_id_a=0, thread_id_a=0) -> np.ndarray:
    """scale_A's codes [..., 16, K/block] -> scale-a-data registers [..., 32] (uint32), zero where not read."""
    byte_id, tid = _selectors(instr, byte_id_a, thread_id_a, instr.thread_ids_a, "a")
    return _pack_scales(codes, SCALE_A_LANE[tid], byte_id, instr.scale_vec, j_axis=-1)


def pack_scales_b(instr: BlockScaledMma, codes, byte_id_b=0, thread_id_b=0) -> np.ndarray:
    """scale_B's codes [..., K/block, 8] -> scale-b-data registers [..., 32] (uint32), zero where not read."""
    byte_id, tid = _selectors(instr, byte_id_b, thread_id_b, instr.thread_ids_b, "b")
    return _pack_scales(codes, SCALE_B_LANE[tid], byte_id, instr.scale_vec, j_axis=-2)


# ---------------------------------------------------------------------------------------------------------------
# The model


def mma(instr: BlockScaledMma, a, b, c, sfa, sfb, byte_id_a=0, thread_id_a=0, byte_id_b=0, thread_id_b=0) -> np.ndarray:
    """D per lane, [..., 32, 4] float32, of `instr` applied to the lanes' registers: a [..., 32, 4] and b
    [..., 32, 2] (uint32), c [..., 32, 4] (float32), sfa and sfb [..., 32] (uint32, scale-a-data / scale-b-data),
    and the selectors (integers, or arrays over the leading dimensions: one per fragment). Leading dimensions
    broadcast: many fragments at once. The arithmetic is the module docstring's steps 1-3."""
    A = decode(instr.atype, unpack_a(instr, a))  # [..., 16, K]
    B = decode(instr.btype, unpack_b(instr, b))  # [..., K, 8]
    SA = decode(instr.stype, read_scales_a(instr, sfa, byte_id_a, thread_id_a))  # [..., 16, nblk]
    SB = decode(instr.stype, read_scales_b(instr, sfb, byte_id_b, thread_id_b))  # [..., nblk, 8]
    C = unpack_c(instr, c)  # [..., 16, 8]
    nblk, bs = instr.scale_vec, instr.block
    Ab = A.reshape(A.shape[:-1] + (nblk, bs))  # [..., 16, nblk, bs]
    Bb = np.swapaxes(B, -1, -2).reshape(B.shape[:-2] + (N, nblk, bs))  # [..., 8, nblk, bs]
    with np.errstate(invalid="ignore", over="ignore"):
        s = (Ab[..., :, None, :, :] * Bb[..., None, :, :, :]).sum(-1)  # 1. exact: [..., 16, 8, nblk]
        t = (s * SA[..., :, None, :] * np.swapaxes(SB, -1, -2)[..., None, :, :]).astype(np.float32)  # 2.
        d = np.broadcast_to(C, np.broadcast_shapes(C.shape, t.shape[:-1])).astype(np.float32)
        for j in range(nblk):  # 3. in K order, fp32 additions
            d = d + t[..., j]
    return pack_c(instr, d)


# ---------------------------------------------------------------------------------------------------------------
# The device side: csrc/block_scaled_tables.h, rendered from the tables above (committed; the CUDA build needs no
# Python step). csrc/block_scaled_mma.cuh issues the instructions on sm_120a / sm_121a and computes the model's
# result elsewhere from these tables alone: which lane and register to fetch each word of a lane's A rows and B
# columns from, where the scales sit, and the element and scale types.
#
#     python -m b12x_kernels.block_scaled_mma --write      # regenerate the header in a checkout
#     python -m b12x_kernels.block_scaled_mma --check      # exit 1 when it is stale

HEADER = "packages/b12x-kernels/csrc/block_scaled_tables.h"
_NOTE = (
    "Generated by `python -m b12x_kernels.block_scaled_mma --write` from b12x_kernels/block_scaled_mma.py: do not edit."
)

# The instructions b12x issues, in the order of their kind ids (csrc: bsmma::Kind; the probe's `kind`).
DEVICE_INSTRUCTIONS = {"NVFP4": NVFP4, "MXF4": MXF4, "MXF8": MXF8, "MXF4_MXF8": MXF4_MXF8}


def kind_id(instr: BlockScaledMma) -> int:
    """The probe's kind id of `instr` (one of DEVICE_INSTRUCTIONS)."""
    return list(DEVICE_INSTRUCTIONS.values()).index(instr)


def _slots(values: np.ndarray) -> list[int]:
    """Per element of a lane's C/D registers: which of the lane's distinct values (of a row or a column index) it
    has, the same for every lane; the table must give each lane as many distinct values, in the same element
    pattern."""
    first = [int(np.flatnonzero(values[0] == v)[0]) for v in values[0]]
    slots = sorted(set(first))
    pattern = [slots.index(f) for f in first]
    for lane in range(LANES):
        for i, s in enumerate(pattern):
            if values[lane, i] != values[lane, slots[s]]:
                raise AssertionError(f"C/D table: lane {lane} element {i} breaks the element pattern {pattern}")
    return pattern


class Gather(NamedTuple):
    """How a lane fetches the words of the matrix lines (A rows, B columns) its D elements need: line slot r, word w
    (the elements w·per_reg .. (w+1)·per_reg − 1 along K, element e of the word at slot e) is register reg[r][w] of
    lane base[r][lane] + step[w]."""

    reg: list[list[int]]
    step: list[int]
    base: list[list[int]]


def _gather(frag: Fragment, slot: Slot, lines: list[np.ndarray], k: int, line_is_row: bool) -> Gather:
    """`lines[r][lane]`: the row of A (column of B) line slot r of the lane needs. Checks that each word is one
    register of one lane, its elements in K order, that the register is the same for every lane (a shuffle sends one
    register) and that the lane is a per-lane base plus a per-word step (one table lookup per line)."""
    n = frag.rows.shape[1]
    where_lane = np.full((M if line_is_row else N, k), -1)
    where_elem = np.full_like(where_lane, -1)
    lane_of, elem = np.meshgrid(np.arange(LANES), np.arange(n), indexing="ij")
    line, kk = (frag.rows, frag.cols) if line_is_row else (frag.cols, frag.rows)
    where_lane[line, kk], where_elem[line, kk] = lane_of, elem
    words = k // slot.per_reg
    reg, step, base = [], [], []
    for r, rows in enumerate(lines):
        src = np.empty((LANES, words), dtype=np.int64)
        regs = np.empty((LANES, words), dtype=np.int64)
        for lane in range(LANES):
            for w in range(words):
                kw = w * slot.per_reg + np.arange(slot.per_reg)
                lanes_w, elems_w = where_lane[rows[lane], kw], where_elem[rows[lane], kw]
                if (lanes_w != lanes_w[0]).any() or (elems_w // slot.per_reg != elems_w[0] // slot.per_reg).any():
                    raise AssertionError(f"word {w} of line {rows[lane]} is not one register of one lane")
                if (elems_w % slot.per_reg != np.arange(slot.per_reg)).any():
                    raise AssertionError(f"word {w} of line {rows[lane]}: elements not in K order")
                src[lane, w], regs[lane, w] = lanes_w[0], elems_w[0] // slot.per_reg
        if (regs != regs[:1]).any():
            raise AssertionError(f"line slot {r}: the register of a word differs between lanes")
        st = src[0] - src[0, 0]
        if (src - src[:, :1] != st).any():
            raise AssertionError(f"line slot {r}: the source lane is not a per-lane base plus a per-word step")
        reg.append([int(x) for x in regs[0]])
        step.append([int(x) for x in st])
        base.append([int(x) for x in src[:, 0]])
    if any(s != step[0] for s in step):
        raise AssertionError("the per-word lane step differs between line slots")
    return Gather(reg, step[0], base)


def _c_array(values) -> str:
    """A C initializer of a (nested) list or array of integers."""
    values = np.asarray(values).tolist() if isinstance(values, np.ndarray) else values
    if isinstance(values, (list, tuple)):
        return "{" + ", ".join(_c_array(v) for v in values) + "}"
    return str(int(values))


def _type_struct(t: ElementType) -> list[str]:
    nan = t.nan[0] if t.nan else -1
    return [
        f"struct {t.name.upper()} {{  // {t.name}",
        f"  static constexpr int bits = {t.bits}, exp_bits = {t.exp_bits}, man_bits = {t.man_bits}, bias = {t.bias};",
        f"  static constexpr bool is_signed = {str(t.signed).lower()}, ieee_specials = {str(t.ieee_specials).lower()},"
        f" no_subnormals = {str(t.no_subnormals).lower()};",
        f"  static constexpr int nan = {nan};  // the magnitude code meaning NaN (-1: none)",
        "};",
    ]


def _block_sum_fits_fp32(instr: BlockScaledMma) -> bool:
    """Whether every partial sum of a block's products is an integer multiple of the smallest product below 2^24
    of it: then fp32 accumulates the block sum exactly."""
    (qa, ma), (qb, mb) = _finite_range(instr.atype), _finite_range(instr.btype)
    return instr.block * ma * mb / (qa * qb) <= 2.0**24


def tables_header() -> str:
    """csrc/block_scaled_tables.h: the text it must hold."""
    lines = [f"// {_NOTE}", "#pragma once", "#include <cstdint>", "", "namespace b12x {", "namespace bsmma {", ""]
    lines.append('// Element and scale types ("Alternate Floating-Point Data Formats"): ElementType.')
    types = []
    for instr in DEVICE_INSTRUCTIONS.values():
        for t in (instr.atype, instr.btype, instr.stype):
            if t not in types:
                types.append(t)
    for t in types:
        lines += _type_struct(t)
    lines += ["", "// The instructions' kind ids (the probe's `kind`).", "enum Kind : int {"]
    lines += [f"  KIND_{name} = {i}," for i, name in enumerate(DEVICE_INSTRUCTIONS)]
    lines += [f"  KINDS = {len(DEVICE_INSTRUCTIONS)},", "};", ""]

    rows, cols = FRAGMENTS[64]["c"]
    for k in (32, 64):
        if (FRAGMENTS[k]["c"].rows != rows).any() or (FRAGMENTS[k]["c"].cols != cols).any():
            raise AssertionError("C/D tables differ between the shapes")
    row_slot, col_slot = _slots(rows), _slots(cols)
    row_lines = [rows[:, row_slot.index(r)] for r in range(max(row_slot) + 1)]
    col_lines = [cols[:, col_slot.index(s)] for s in range(max(col_slot) + 1)]
    lines += [
        '// C/D ("Matrix Fragments", the same for both shapes): element i of a lane\'s C/D registers lies in the',
        "// lane's row slot C_ROW_SLOT[i] (its row of A) and column slot C_COL_SLOT[i] (its column of B).",
        f"constexpr int C_ROW_SLOTS = {len(row_lines)}, C_COL_SLOTS = {len(col_lines)};",
        f"constexpr int C_ROW_SLOT[4] = {_c_array(row_slot)};",
        f"constexpr int C_COL_SLOT[4] = {_c_array(col_slot)};",
        "",
        "// Scale registers (\"Block Scaling for mma.sync\"): scale_A's row of the lane's row slot r is in",
        "// scale-a-data of lane SFA_LANE[thread-id-a][r][lane], scale_B's column of column slot s in",
        "// scale-b-data of lane SFB_LANE[thread-id-b][s][lane]; in that register byte byte-id + j holds block j.",
        f"static __constant__ uint8_t SFA_LANE[2][{len(row_lines)}][32] = "
        f"{_c_array([[SCALE_A_LANE[t][r] for r in row_lines] for t in (0, 1)])};",
        f"static __constant__ uint8_t SFB_LANE[4][{len(col_lines)}][32] = "
        f"{_c_array([[SCALE_B_LANE[t][c] for c in col_lines] for t in (0, 1, 2, 3)])};",
        "",
    ]
    shapes = {}
    for instr in DEVICE_INSTRUCTIONS.values():
        key = (instr.k, instr.a_slot.per_reg, instr.b_slot.per_reg)
        if key in shapes:
            continue
        name = f"K{instr.k}_{instr.a_slot.per_reg}_{instr.b_slot.per_reg}"
        shapes[key] = name
        ga = _gather(FRAGMENTS[instr.k]["a"], instr.a_slot, row_lines, instr.k, line_is_row=True)
        gb = _gather(FRAGMENTS[instr.k]["b"], instr.b_slot, col_lines, instr.k, line_is_row=False)
        lines += [
            f"// m16n8k{instr.k}, {instr.a_slot.per_reg} A and {instr.b_slot.per_reg} B elements per register:",
            "// word w of the lane's row slot r of A (its elements w·per_reg .. (w+1)·per_reg - 1 along K, element e",
            "// at slot e) is register A_REG[r][w] of lane a_base(r, lane) + A_STEP[w]; word w of column slot s of B",
            "// likewise.",
            f"static __constant__ uint8_t {name}_A_BASE[{len(ga.base)}][32] = {_c_array(ga.base)};",
            f"static __constant__ uint8_t {name}_B_BASE[{len(gb.base)}][32] = {_c_array(gb.base)};",
            f"struct {name} {{",
            f"  static constexpr int k = {instr.k}, a_per_reg = {instr.a_slot.per_reg}, "
            f"b_per_reg = {instr.b_slot.per_reg};",
            f"  static constexpr int A_REG[{len(ga.reg)}][{len(ga.step)}] = {_c_array(ga.reg)};",
            f"  static constexpr int A_STEP[{len(ga.step)}] = {_c_array(ga.step)};",
            f"  static constexpr int B_REG[{len(gb.reg)}][{len(gb.step)}] = {_c_array(gb.reg)};",
            f"  static constexpr int B_STEP[{len(gb.step)}] = {_c_array(gb.step)};",
            f"  static __device__ __forceinline__ int a_base(int r, int lane) {{ return {name}_A_BASE[r][lane]; }}",
            f"  static __device__ __forceinline__ int b_base(int s, int lane) {{ return {name}_B_BASE[s][lane]; }}",
            "};",
            "",
        ]
    lines.append("// The instructions: types, element containers (Slot), Table 40's byte-ids, the PTX.")
    for i, (name, instr) in enumerate(DEVICE_INSTRUCTIONS.items()):
        a, b = instr.a_slot, instr.b_slot
        shape = shapes[(instr.k, a.per_reg, b.per_reg)]
        byte_mask = sum(1 << x for x in instr.byte_ids)
        lines += [
            f'#define B12X_BSMMA_PTX_{name} "{instr.ptx}"',
            f"struct {name} {{",
            f"  using atype = {instr.atype.name.upper()};",
            f"  using btype = {instr.btype.name.upper()};",
            f"  using stype = {instr.stype.name.upper()};",
            f"  using frag = {shape};",
            f"  static constexpr int kind = {i}, k = {instr.k}, scale_vec = {instr.scale_vec}, block = {instr.block};",
            f"  static constexpr int a_per_reg = {a.per_reg}, a_width = {a.width}, a_shift = {a.shift};",
            f"  static constexpr int b_per_reg = {b.per_reg}, b_width = {b.width}, b_shift = {b.shift};",
            f"  static constexpr int byte_ids = {byte_mask:#x};  // bit x: byte-id x is valid",
            f"  static constexpr bool fp32_block_sum = {str(_block_sum_fits_fp32(instr)).lower()};"
            "  // fp32 sums a block exactly",
            "};",
        ]
    lines += ["", "}  // namespace bsmma", "}  // namespace b12x", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from b12x_formats import codegen

    return codegen.cli(
        "Render csrc/block_scaled_tables.h", lambda: {HEADER: tables_header()},
        "python -m b12x_kernels.block_scaled_mma --write", argv,
    )  # fmt: skip


if __name__ == "__main__":
    import sys

    sys.exit(main())
