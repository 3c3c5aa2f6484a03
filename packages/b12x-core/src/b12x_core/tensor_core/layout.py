"""The tensor-core GEMM's weight layout (b12x_kernels csrc/mma_gemm.cu): made once at prepare time from the
checkpoint tensors, lossless (`unpack` gives the checkpoint bytes back) and no larger than them plus padding of
N to 16 rows and K to one chunk.

A *chunk* is the K span one warp reads per step: 64 weights for 8-bit codes, 128 for FP4, one 256-weight block
for IQ2. Codes are stored as 1 KB tiles (16 rows × one chunk) in the order the kernel's lanes load them: tile
(n16, c) holds two 512-byte halves (rows 0-7, rows 8-15); in a half, lane 4q+t reads 16 bytes = the t-th
quarter of row q's chunk. Within those 16 bytes the codes are permuted so that each bf16x2 MMA operand comes
out of a 32-bit word with shifts and masks (see `_permute_words`). Block scales (`meta`) are stored per
(row, chunk) in the same row blocking: [n16][chunk][half][q][bytes], so a lane reads its row's scales of a chunk
with one small load.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import ml_dtypes
import numpy as np

import b12x_formats as bf
from b12x_formats import kernel_facts, tables
from b12x_formats.quantized import codec_for

from .geometry import LANE_BYTES, MMA, QUAD, TILE_ROWS, chunk_k

FORMATS = MMA.formats  # every format has a layout here


@dataclass
class MmaWeight:
    """A weight in the kernel's layout (numpy, host side; b12x_core uploads it)."""

    format: str
    n: int
    k: int
    chunks: int
    codes: np.ndarray  # uint8, [ceil(N/16) * chunks * 1024]
    meta: np.ndarray | None  # uint8 row-blocked scales
    meta2: np.ndarray | None  # IQ2_XS: sub-block scales, row-blocked
    block_scale: np.ndarray | None  # FP8_BLOCK: float32 [ceil(N/128), ceil(K/128)]
    alpha: float  # factor of the result: the per-tensor scale, times 1/scale_mul's share (see decode_range)
    scale_mul: float = 1.0  # power of two the kernel multiplies block scales by (bit-pattern decodes)
    exact_down_to: float = 0.0  # the smallest scale_mul under which every decoded product stays exact (share_scale_mul)


def _pad(a: np.ndarray, rows: int, cols: int, value: int = 0) -> np.ndarray:
    out = np.full((rows, cols) + a.shape[2:], value, dtype=a.dtype)
    out[: a.shape[0], : a.shape[1]] = a
    return out


def _tiles(code_bytes: np.ndarray, chunks: int) -> np.ndarray:
    """[N, chunks*64] bytes (row-major) -> lane-ordered 1 KB tiles [n16, chunk, half, q, t, 16]."""
    n16 = -(-code_bytes.shape[0] // TILE_ROWS)
    b = _pad(code_bytes, n16 * TILE_ROWS, chunks * QUAD * LANE_BYTES)
    b = b.reshape(n16, 2, 8, chunks, QUAD, LANE_BYTES)
    return np.ascontiguousarray(b.transpose(0, 3, 1, 2, 4, 5)).reshape(-1)


def _untiles(tiles: np.ndarray, n: int, chunks: int) -> np.ndarray:
    n16 = -(-n // TILE_ROWS)
    b = tiles.reshape(n16, chunks, 2, 8, QUAD, LANE_BYTES).transpose(0, 2, 3, 1, 4, 5)
    return b.reshape(n16 * TILE_ROWS, chunks * QUAD * LANE_BYTES)[:n]


def _rows_blocked(per_row_chunk: np.ndarray, chunks: int, pad_value: int) -> np.ndarray:
    """[N, chunks, bytes] -> [n16, chunk, half, q, bytes] (a lane's row q + 8·half)."""
    n, _, nbytes = per_row_chunk.shape
    n16 = -(-n // TILE_ROWS)
    b = _pad(per_row_chunk, n16 * TILE_ROWS, chunks, pad_value).reshape(n16, 2, 8, chunks, nbytes)
    return np.ascontiguousarray(b.transpose(0, 3, 1, 2, 4)).reshape(-1)


def _unrows_blocked(blocked: np.ndarray, n: int, chunks: int, nbytes: int) -> np.ndarray:
    n16 = -(-n // TILE_ROWS)
    b = blocked.reshape(n16, chunks, 2, 8, nbytes).transpose(0, 2, 3, 1, 4)
    return b.reshape(n16 * TILE_ROWS, chunks, nbytes)[:n]


# Code permutations inside each 32-bit word of a lane's 16 bytes, so each bf16x2 MMA operand comes out of a word
# with a few shifts and masks:
# E4M3: [e0 e1 e2 e3] -> [e0 e2 e1 e3]: pair (e0,e1) sits at bytes 0 and 2, pair (e2,e3) at 1 and 3.
# E2M1 (8 codes e0..e7, pairs p = (e2p, e2p+1)): the low element's magnitude bits m0 m1 m2 and sign at the
# positions below, the high element's 16 bits further. Pairs 0-2 keep bf16's spacing (magnitude at L..L+2,
# sign at L+9), so one shift and one mask give bf16 bits 6-8 / 15 (22-24 / 31), value·2^-126; pair 3 takes
# the four positions left and three shifts (csrc/mma_gemm.cuh e2m1_pair).
E2M1_FIELDS = ((6, 7, 8, 15), (3, 4, 5, 12), (0, 1, 2, 9), (10, 11, 13, 14))  # (m0, m1, m2, sign) per pair


def _permute_words(code_bytes: np.ndarray, fmt: str, inverse: bool = False) -> np.ndarray:
    spec = bf.spec(fmt)
    if spec.packing == "ggml":
        return code_bytes ^ np.uint8(0x80) if spec.name == "Q8_0" else code_bytes  # Q8_0: offset binary
    words = code_bytes.reshape(code_bytes.shape[0], -1, 4)
    if spec.bits_per_weight >= 8:
        return np.ascontiguousarray(words[..., [0, 2, 1, 3]]).reshape(code_bytes.shape)
    # Each output word is the OR of what its four bytes contribute (the permutation moves single bits), so four
    # 256-entry tables replace 32 shift-and-mask passes over the weight (a 70B gate_up repacks in about a second).
    tables = _byte_tables(inverse)
    b = np.ascontiguousarray(words)
    out = tables[0][b[..., 0]] | tables[1][b[..., 1]] | tables[2][b[..., 2]] | tables[3][b[..., 3]]
    return out.astype("<u4").view(np.uint8).reshape(code_bytes.shape)


@functools.cache
def _byte_tables(inverse: bool) -> tuple[np.ndarray, ...]:
    """Per byte position of a 32-bit word, value -> its bits moved to where E2M1_FIELDS put them (uint32)."""
    moves = []  # (source bit, destination bit) over the word
    for p, fields in enumerate(E2M1_FIELDS):
        for half, e in ((0, 2 * p), (1, 2 * p + 1)):
            for bit, at in enumerate(fields):  # code bit 0-2: magnitude, bit 3: sign
                moves.append((at + 16 * half, 4 * e + bit) if inverse else (4 * e + bit, at + 16 * half))
    values = np.arange(256, dtype=np.uint32)
    tables = []
    for byte in range(4):
        table = np.zeros(256, dtype=np.uint32)
        for src, dst in moves:
            if src // 8 == byte:
                table |= ((values >> np.uint32(src % 8)) & 1) << np.uint32(dst)
        tables.append(table)
    return tuple(tables)


def _ggml_fields(spec) -> tuple[int, int, int]:
    """(d bytes, code bytes, sub-block scale bytes) of one GGML block, from its codec's field offsets: the fp16
    d, then the codes (Q8_0: 32 int8; IQ2: grid and sign indices), then IQ2_XS's sub-block scales."""
    codec = codec_for(spec.name)
    end = getattr(codec, "SCALES_OFFSET", spec.block_bytes)
    return codec.QS_OFFSET, end - codec.QS_OFFSET, spec.block_bytes - end


def _per_tensor(tensors: dict, name: str) -> float:
    return float(np.asarray(tensors[name], dtype=np.float32).reshape(-1)[0]) if name in tensors else 1.0


def pack(qw: bf.QuantizedWeight) -> MmaWeight:
    """Checkpoint tensors of one [N, K] weight -> the kernel's layout."""
    spec = bf.spec(qw.format)
    if spec.name not in FORMATS or len(qw.shape) != 2:
        raise ValueError(f"the tensor-core GEMM takes [N, K] weights of {sorted(FORMATS)}, got {qw}")
    n, k = qw.shape
    t = qw.tensors
    ck = chunk_k(spec.name)
    chunks = -(-k // ck)
    meta = meta2 = block_scale = None
    alpha = 1.0
    if spec.packing == "ggml":
        per_chunk = ck // spec.group_size  # Q8_0: two blocks per chunk; IQ2: one
        blocks = np.ascontiguousarray(t["weight"]).view(np.uint8).reshape(n, -1, spec.block_bytes)
        blocks = _pad(blocks, n, chunks * per_chunk)  # zero d: the padded weights are zero
        d_bytes, code_bytes, extra = _ggml_fields(spec)
        codes = blocks[:, :, d_bytes : d_bytes + code_bytes].reshape(n, -1)
        meta = _rows_blocked(blocks[:, :, :d_bytes].reshape(n, chunks, -1), chunks, 0)
        if extra:
            meta2 = _rows_blocked(blocks[:, :, d_bytes + code_bytes :].reshape(n, chunks, -1), chunks, 0)
        codes = _permute_words(codes, spec.name)
    else:
        codes = np.ascontiguousarray(t["weight"]).view(np.uint8).reshape(n, -1)
        codes = _permute_words(_pad(codes, n, chunks * QUAD * LANE_BYTES), spec.name)
        if spec.block_scale_code is not None:  # MX and NVFP4: one scale byte per group
            scales = np.ascontiguousarray(t["weight_scale"]).view(np.uint8).reshape(n, -1)
            per_chunk = ck // spec.group_size
            pad_value = 127 if spec.block_scale_code == "e8m0" else 0  # E8M0 1.0 / E4M3 0 under zero codes
            scales = _pad(scales, n, chunks * per_chunk, pad_value).reshape(n, chunks, per_chunk)
            meta = _rows_blocked(scales, chunks, pad_value)
        if spec.name == "FP8_BLOCK":
            block_scale = np.ascontiguousarray(t["weight_scale_inv"], dtype=np.float32)
        if spec.name == "FP8":
            alpha = _per_tensor(t, "weight_scale")
        elif "NVFP4" in spec.name:
            alpha = _per_tensor(t, "weight_scale_2")
    scale_mul, alpha_shift = decode_range(spec.name, t)
    return MmaWeight(spec.name, n, k, chunks, _tiles(codes, chunks), meta, meta2, block_scale, alpha * alpha_shift,
                     scale_mul, _exact_down_to(spec.name, t))  # fmt: skip


# The kernel decodes E4M3 codes to bf16 bit patterns worth value·2^-120 and E2M1 codes to value·2^-126, then
# multiplies once by (block scale · scale_mul) in bf16. scale_mul = 2^(bias − e) with e the smallest power that
# keeps the largest block scale times scale_mul finite in bf16; the result is then 2^-e too small, so alpha
# carries 2^e. e stays ≥ 0, so products never leave the range the plain values have.
_BIT_PATTERN_BIAS = {"FP8": 120, "FP8_BLOCK": 120, "MXFP8": 120, "MXFP4": 126, "NVFP4": 126, "W4A16_NVFP4": 126}


def decode_range(fmt: str, tensors: dict) -> tuple[float, float]:
    """(scale_mul, alpha_shift = 2^e) for a weight whose block scales are tensors["weight_scale"] (the checkpoint's
    bytes, any shape): the rule above, which the Hopper CUTLASS layout's decode-sized GEMM (backends.fragment_mma)
    shares."""
    bias = _BIT_PATTERN_BIAS.get(fmt)
    if bias is None:
        return 1.0, 1.0
    if fmt in ("FP8", "FP8_BLOCK"):
        return 2.0**bias, 1.0
    scales = np.ascontiguousarray(tensors["weight_scale"]).view(np.uint8)
    if bf.spec(fmt).block_scale_code == "e8m0":
        top = int(scales.max()) - 127  # E8M0: 2^(b-127)
    else:
        top = int(np.ceil(np.log2(max(float(scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32).max()), 2**-9))))
    e = max(0, top + 2)
    return 2.0 ** (bias - e), 2.0**e


# The smallest nonzero magnitude a code decodes to: E2M1 0.5, E4M3 2^-9 (its smallest subnormal).
_SMALLEST_CODE = {"MXFP8": 2.0**-9, "MXFP4": 0.5, "NVFP4": 0.5, "W4A16_NVFP4": 0.5}


def _exact_down_to(fmt: str, tensors: dict) -> float:
    """The smallest scale_mul under which the kernel's decode stays exact for this weight: each nonzero product
    value · block scale · scale_mul · 2^-bias must be a normal bf16 (≥ 2^-126; E2M1 · E8M0 / E4M3 and E4M3 · E8M0
    products then hold their few significant bits exactly). Zero block scales (NVFP4) zero their block whatever
    the multiplier. Formats without a block-scale range (scale_mul fixed by the format): their own scale_mul."""
    smallest = _SMALLEST_CODE.get(fmt)
    if smallest is None:
        return decode_range(fmt, tensors)[0]
    codes = np.ascontiguousarray(tensors["weight_scale"]).view(np.uint8)
    if bf.spec(fmt).block_scale_code == "e8m0":
        least = 2.0 ** (int(codes.min()) - 127)
    else:
        values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        nonzero = np.abs(values[values != 0])
        if not nonzero.size:
            return 0.0
        least = float(nonzero.min())
    return 2.0 ** (_BIT_PATTERN_BIAS[fmt] - 126) / (smallest * least)


def share_scale_mul(parts: list[MmaWeight]) -> list[MmaWeight]:
    """Row shards of one format whose scale_mul differ (their largest block scales differ), rebased onto the
    smallest of them where every shard's decode stays exact under it (exact_down_to): each shard's alpha grows by the
    same power of two its products shrink by, so its results are the same bits. Otherwise the parts unchanged."""
    muls = {p.scale_mul for p in parts}
    if len(muls) < 2 or len({p.format for p in parts}) > 1:
        return parts
    target = min(muls)
    if any(target < p.exact_down_to for p in parts):
        return parts
    return [dataclasses.replace(p, scale_mul=target, alpha=p.alpha * (p.scale_mul / target)) for p in parts]


def unpack(mw: MmaWeight) -> dict[str, np.ndarray]:
    """The checkpoint's block/code bytes back from the layout (the bijectivity check): {"weight": uint8 bytes
    as stored in the checkpoint, "weight_scale": uint8 bytes (MX/NVFP4)}."""
    spec = bf.spec(mw.format)
    ck = chunk_k(spec.name)
    row_bytes = mw.chunks * QUAD * LANE_BYTES
    codes = _permute_words(_untiles(mw.codes, mw.n, mw.chunks), spec.name, inverse=True)
    k_bytes = mw.k * row_bytes // (mw.chunks * ck)
    out = {}
    if spec.packing == "ggml":
        nblocks, per_chunk = mw.k // spec.group_size, ck // spec.group_size
        d_bytes, code_bytes, extra = _ggml_fields(spec)
        d = _unrows_blocked(mw.meta, mw.n, mw.chunks, d_bytes * per_chunk).reshape(mw.n, -1, d_bytes)
        parts = [d[:, :nblocks], codes[:, :k_bytes].reshape(mw.n, nblocks, code_bytes)]
        if extra:
            parts.append(_unrows_blocked(mw.meta2, mw.n, mw.chunks, extra)[:, :nblocks])
        out["weight"] = np.concatenate(parts, axis=-1)
        return out
    out["weight"] = np.ascontiguousarray(codes[:, :k_bytes])
    if mw.meta is not None:
        per_chunk = ck // spec.group_size
        scales = _unrows_blocked(mw.meta, mw.n, mw.chunks, per_chunk).reshape(mw.n, -1)
        out["weight_scale"] = np.ascontiguousarray(scales[:, : mw.k // spec.group_size])
    return out


def merge_blocker(parts: list[MmaWeight]) -> str | None:
    """Why row shards' layouts cannot be one layout over all their rows (concat_rows), or None when they can: one
    format, K and chunk count, tiles that do not straddle shards (every shard but the last whole 16-row tiles),
    FP8_BLOCK's 128-row scale blocks likewise, and one scale_mul (the kernel takes one per launch)."""
    first = parts[0]
    for p in parts[1:]:
        if (p.format, p.k, p.chunks) != (first.format, first.k, first.chunks):
            return f"shards differ in format or K: {first.format} K={first.k} vs {p.format} K={p.k}"
    rows = kernel_facts.FP8_BLOCK_SIZE if first.format == "FP8_BLOCK" else TILE_ROWS
    if any(p.n % rows for p in parts[:-1]):
        return f"a shard other than the last has rows not a multiple of {rows}: {[p.n for p in parts]}"
    if len({p.scale_mul for p in parts}) > 1:
        return f"shards' block-scale ranges need different scale_mul: {[p.scale_mul for p in parts]}"
    return None


def concat_rows(parts: list[MmaWeight]) -> MmaWeight:
    """Row shards' layouts as one layout of all their rows, in order (the layout is tile-major, so the arrays
    concatenate); its alpha is 1: each shard's alpha is the caller's to apply per row. Raises ValueError where
    merge_blocker names a reason."""
    why = merge_blocker(parts)
    if why:
        raise ValueError(f"cannot concatenate these row shards' layouts: {why}")
    first = parts[0]

    def joined(name: str) -> np.ndarray | None:
        arrays = [getattr(p, name) for p in parts]
        return None if arrays[0] is None else np.concatenate(arrays)

    return MmaWeight(first.format, sum(p.n for p in parts), first.k, first.chunks, joined("codes"), joined("meta"),
                     joined("meta2"), joined("block_scale"), 1.0, first.scale_mul,
                     max(p.exact_down_to for p in parts))  # fmt: skip


def iq2_tables(fmt: str) -> np.ndarray:
    """uint32 [grid entries + 128]: each grid entry's 8 values as nibble codes (8 -> 0, 25 -> 1, 43 -> 2),
    then each 7-bit sign index's 8 signs as bit 2 of each nibble (the kernel ORs the two into PRMT selectors)."""
    grid = np.asarray(codec_for(fmt).grid(), dtype=np.uint8).reshape(-1, 8)
    values = np.unique(grid)
    if values.tolist() != [8, 25, 43]:
        raise AssertionError(f"unexpected IQ2 grid values {values.tolist()}")
    codes = np.searchsorted(values, grid).astype(np.uint32)
    grid_words = np.zeros(len(grid), dtype=np.uint32)
    for j in range(8):
        grid_words |= codes[:, j] << np.uint32(4 * j)
    signs = tables.ksigns_iq2xs().astype(np.uint32)
    sign_words = np.zeros(128, dtype=np.uint32)
    for j in range(8):
        sign_words |= ((signs >> np.uint32(j)) & 1) << np.uint32(4 * j + 2)
    return np.concatenate([grid_words, sign_words])
