"""Dequantize a weight held in the tensor-core GEMM's layout (b12x_core.tensor_core.layout: lane-ordered 1 KB tiles,
row-blocked scale bytes) to bf16 [N, K], with the same values, operations and single rounding as
tiles.dequantize_tiles on the checkpoint layout. So a plan that runs the tensor-core GEMM at small M and dequantize +
cuBLAS at large M keeps one copy of the weight on the device (the repacked one) instead of two.

Addressing (b12x_core.tensor_core.layout): byte i (0..63) of row n's chunk c sits in tile (n // 16, c), half
(n % 16) // 8, lane 4·(n % 8) + i // 16, byte i % 16. Within a lane's bytes the codes are permuted per 32-bit word:
e4m3 bytes [e0 e2 e1 e3]; E2M1 pair p's bits at `fields` (tensor_core.layout.E2M1_FIELDS, passed in: one source);
Q8_0 stored offset-binary (q + 128); IQ2 bytes unchanged (the GGML qs bytes, d in `meta`, IQ2_XS's scales in `meta2`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from b12x_formats.kernel_facts import FORMAT_IDS, format_id
from b12x_formats.quantized import codec_for

from .element_decode import e2m1_bits_value, e8m0_value
from .format_facts import (
    FMT_FP8,
    FMT_FP8_BLOCK,
    FMT_IQ2_XXS,
    FMT_MXFP4,
    FMT_MXFP8,
    FMT_NVFP4,
    FMT_Q8_0,
    FP8_BLOCK_SIZE,
)

TILE_ROWS = 16  # the layout's row tile
# A program's share (rows, chunks, warps): rows a power of two of row tiles (a Triton block). Four row tiles × one
# chunk, 4 warps, is within 1% of the best of ten shapes for the FP4, FP8 and Q8_0 formats (a quarter faster than one
# tile for NVFP4); IQ2's grid lookups run best at one tile (15% faster than four). `benchmarks/dequantize_pass.py
# --programs 16x1x4,64x1x4,...` re-measures them on the 8B layer.
DEFAULT_PROGRAM = (64, 1, 4)
PROGRAM: dict[str, tuple[int, int, int]] = {"IQ2_XS": (16, 1, 4), "IQ2_XXS": (16, 1, 4)}  # by format, overrides


@triton.jit
def _fp16_of(lo, hi):
    """float32 of the little-endian fp16 made of two uint8 tensors."""
    return (lo.to(tl.uint16) | (hi.to(tl.uint16) << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _chunk_word(words_ptr, tile_bytes, w):
    """32-bit word w (0..15) of a row's chunk, through an int32 view of the codes (a lane's 16 bytes are 4 words)."""
    return tl.load(words_ptr + tile_bytes // 4 + (w // 4) * 4 + w % 4).to(tl.uint32, bitcast=True)


@triton.jit
def _dequantize_mma(codes_ptr, meta_ptr, meta2_ptr, block_scale_ptr, grid_ptr, sign_ptr, fields_ptr, row_factor_ptr,
                    out_ptr, N, K, CHUNKS, FMT: tl.constexpr, KB: tl.constexpr, META: tl.constexpr,
                    META2: tl.constexpr, ROWS: tl.constexpr = 16, CPP: tl.constexpr = 1):  # fmt: skip
    """Rows ROWS·pid0 .. +ROWS (whole 16-row tiles), chunks CPP·pid1 .. +CPP (KB columns each) -> out (bf16, row
    stride K). Loads past the last tile or chunk read the last one's bytes (clamped); their stores are masked."""
    n = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    tile = tl.minimum(n // 16, (N - 1) // 16).to(tl.int64)  # the 16-row tile, clamped to the weight's last
    r = n % 16  # row within the tile
    kk = tl.arange(0, KB)[None, :]  # column within the chunk
    for j in tl.static_range(CPP):
        c_out = tl.program_id(1) * CPP + j
        _dequantize_chunk(codes_ptr, meta_ptr, meta2_ptr, block_scale_ptr, grid_ptr, sign_ptr, fields_ptr,
                          row_factor_ptr, out_ptr, N, K, CHUNKS, tile, r, n, tl.minimum(c_out, CHUNKS - 1),
                          c_out * KB + kk, kk, FMT, KB, META, META2, ROWS)  # fmt: skip


@triton.jit
def _dequantize_chunk(codes_ptr, meta_ptr, meta2_ptr, block_scale_ptr, grid_ptr, sign_ptr, fields_ptr, row_factor_ptr,
                      out_ptr, N, K, CHUNKS, tile, r, n, c, k, kk, FMT: tl.constexpr, KB: tl.constexpr,
                      META: tl.constexpr, META2: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Rows n (tile, row r within it) of chunk c: columns k (kk within the chunk) -> out."""
    # byte 0 of row n's chunk c in the tile, and row n's scale bytes of chunk c
    tile_bytes = ((tile * CHUNKS + c) * 2 + r // 8) * 512 + (r % 8) * 64
    row_meta = (tile * CHUNKS + c) * 16 + r

    if FMT == FMT_FP8 or (FMT == FMT_FP8_BLOCK or FMT == FMT_MXFP8 or FMT == FMT_Q8_0):  # a byte per weight
        # word w holds weights 4w .. 4w+3: e4m3 bytes [e0 e2 e1 e3], Q8_0's in order; one load per 4 weights
        word = _chunk_word(codes_ptr, tl.expand_dims(tile_bytes, 2), tl.arange(0, KB // 4)[None, :, None])
        e = tl.arange(0, 4)[None, None, :]
        pos = e if FMT == FMT_Q8_0 else tl.where(e == 1, 2, tl.where(e == 2, 1, e))
        byte = tl.reshape(((word >> (8 * pos).to(tl.uint32)) & 255).to(tl.uint8), (BLOCK_N, KB))
        if FMT == FMT_Q8_0:
            q = (byte ^ 128).to(tl.int8, bitcast=True).to(tl.float32)
            j = 2 * (kk // 32)  # fp16 d of the chunk's block kk // 32
            d = _fp16_of(tl.load(meta_ptr + row_meta * META + j), tl.load(meta_ptr + row_meta * META + j + 1))
            w = (q * d).to(tl.bfloat16).to(tl.float32)
        else:
            w = byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            if FMT == FMT_MXFP8:
                w = (w * e8m0_value(tl.load(meta_ptr + row_meta * META + kk // 32))).to(tl.bfloat16).to(tl.float32)
    elif FMT == FMT_NVFP4 or FMT == FMT_MXFP4:  # word w holds weights 8w .. 8w+7; pair p's bits at fields[4p..]
        word = _chunk_word(codes_ptr, tl.expand_dims(tile_bytes, 2), tl.arange(0, KB // 8)[None, :, None]).to(
            tl.int32, bitcast=True
        )  # one load per 8 weights
        e = tl.arange(0, 8)[None, None, :]
        at = 4 * (e // 2)
        up = (e % 2) * 16  # the high element of a pair sits 16 bits up
        # magnitude bit b from its field (each field f_b ≥ b, so a right shift by f_b − b puts it at bit b), sign bit
        m = (word >> (tl.load(fields_ptr + at) + up)) & 1
        m |= (word >> (tl.load(fields_ptr + at + 1) + up - 1)) & 2
        m |= (word >> (tl.load(fields_ptr + at + 2) + up - 2)) & 4
        negative = (word >> (tl.load(fields_ptr + at + 3) + up)) & 1
        value = tl.reshape(e2m1_bits_value(m, negative), (BLOCK_N, KB))
        if FMT == FMT_NVFP4:
            s = tl.load(meta_ptr + row_meta * META + kk // 16).to(tl.float32)  # meta_ptr: an fp8 tensor
        else:
            s = e8m0_value(tl.load(meta_ptr + row_meta * META + kk // 32))
        w = value * s  # ≤ 6 significant bits (E2M1's 2 times E4M3's 4 or a power of two): exact in bf16, no rounding
    else:  # IQ2_XXS / IQ2_XS: the chunk is one 256-weight block; group g of 8 weights, element e of the group
        tb3 = tl.expand_dims(tile_bytes, 2)
        rm3 = tl.expand_dims(row_meta, 2)
        g = tl.arange(0, 32)[None, :, None]
        e = tl.arange(0, 8)[None, None, :]
        d = _fp16_of(tl.load(meta_ptr + rm3 * META), tl.load(meta_ptr + rm3 * META + 1))
        if FMT == FMT_IQ2_XXS:  # per 32 weights (words 2s, 2s+1): 4 grid bytes, then (4 × 7 sign bits, 4-bit scale)
            grid_idx = ((_chunk_word(codes_ptr, tb3, 2 * (g // 4)) >> (8 * (g % 4)).to(tl.uint32)) & 255).to(tl.int32)
            aux = _chunk_word(codes_ptr, tb3, 2 * (g // 4) + 1)
            sign_idx = ((aux >> (7 * (g % 4)).to(tl.uint32)) & 127).to(tl.int32)
            nibble = (aux >> 28).to(tl.int32)
        else:  # u16 per group (9-bit grid index, 7-bit sign index); two 4-bit scales per byte of meta2
            q = ((_chunk_word(codes_ptr, tb3, g // 2) >> (16 * (g % 2)).to(tl.uint32)) & 65535).to(tl.int32)
            grid_idx = q & 511
            sign_idx = q >> 9
            nibble = (tl.load(meta2_ptr + rm3 * META2 + g // 4).to(tl.int32) >> (4 * ((g // 2) % 2))) & 15
        db = d * (0.5 + nibble.to(tl.float32)) * 0.25  # llama.cpp's order of operations (as tiles._decode)
        magnitude = ((tl.load(grid_ptr + grid_idx) >> (8 * e).to(tl.int64)) & 255).to(tl.float32)
        negative = (tl.load(sign_ptr + sign_idx).to(tl.int32) >> e) & 1
        v = (tl.where(negative != 0, -magnitude, magnitude) * db).to(tl.bfloat16).to(tl.float32)
        w = tl.reshape(v, (BLOCK_N, KB))
    if FMT == FMT_FP8_BLOCK:
        kblocks = tl.cdiv(K, FP8_BLOCK_SIZE)
        w = w * tl.load(block_scale_ptr + (n // FP8_BLOCK_SIZE) * kblocks + k // FP8_BLOCK_SIZE, mask=(n < N) & (k < K),
                        other=0.0)  # fmt: skip
    w = w * tl.load(row_factor_ptr + n, mask=n < N, other=0.0)
    tl.store(out_ptr + n.to(tl.int64) * K + k, w.to(tl.bfloat16), mask=(n < N) & (k < K))


def dequantize_mma(fmt: str, codes, meta, meta2, block_scale, grid_table, sign_table, fields, row_factor, out,
                   chunk_k: int, chunks: int, program: tuple[int, int, int] | None = None) -> None:  # fmt: skip
    """out [n, K] bf16 (row stride K, written) = the weight in tensor_core.layout's layout, dequantized as
    tiles.dequantize_tiles dequantizes the checkpoint layout, times row_factor [n] (float32: per-tensor factors).
    meta / meta2 / block_scale / the IQ2 tables: None where the format has none; fields: int32 [16]
    (tensor_core.layout.E2M1_FIELDS) for the FP4 formats. program: (rows, chunks, warps) a program (rows a power of
    two of 16-row tiles), else the measured default."""
    if program is not None and (program[0] % TILE_ROWS or program[0] & (program[0] - 1) or min(program) < 1):
        raise ValueError(
            f"dequantize_mma: a program's rows are a power of two of {TILE_ROWS}-row tiles, its chunks "
            f"and warps at least 1; not {program}"
        )
    if fmt not in FORMAT_IDS:
        raise ValueError(f"dequantize_mma: unknown format {fmt!r}; known {tuple(FORMAT_IDS)}")
    n, k = out.shape
    spec = codec_for(fmt).spec  # the format's facts, never its name
    if spec.block_scale_code == "e4m3":  # e4m3 block scales (NVFP4)
        meta = meta.view(torch.float8_e4m3fn)
    codes = codes.view(torch.int32)  # read a word at a time (1 KB tiles)
    dummy = row_factor
    padded_rows = triton.cdiv(n, TILE_ROWS) * TILE_ROWS
    meta_bytes = 0 if meta is None else meta.numel() // (padded_rows * chunks)
    meta2_bytes = 0 if meta2 is None else meta2.numel() // (padded_rows * chunks)
    rows, cpp, warps = program or PROGRAM.get(fmt, DEFAULT_PROGRAM)
    grid = (triton.cdiv(n, rows), triton.cdiv(chunks, cpp))
    _dequantize_mma[grid](
        codes, dummy if meta is None else meta, dummy if meta2 is None else meta2,
        dummy if block_scale is None else block_scale, dummy if grid_table is None else grid_table,
        dummy if sign_table is None else sign_table, dummy if fields is None else fields, row_factor, out, n, k, chunks,
        FMT=format_id(fmt), KB=chunk_k, META=meta_bytes, META2=meta2_bytes, ROWS=rows, CPP=cpp, num_warps=warps,
    )  # fmt: skip
