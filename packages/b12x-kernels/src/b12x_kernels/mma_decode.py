"""Decode a weight held in the tensor-core GEMM's layout (b12x_core.tensor_core.layout: lane-ordered 1 KB tiles,
row-blocked scale bytes) to bf16 [N, K], with the same values, operations and single rounding as
tiles.dequantize_tiles on the checkpoint layout. So a plan that runs the tensor-core GEMM at small M and decode +
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

from .element_decode import e2m1_value, e8m0_value
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

BLOCK_N = tl.constexpr(16)  # one row tile per program


@triton.jit
def _fp16_of(lo, hi):
    """float32 of the little-endian fp16 made of two uint8 tensors."""
    return (lo.to(tl.uint16) | (hi.to(tl.uint16) << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _chunk_byte(codes_ptr, tile_bytes, i):
    """Byte i (0..63) of a row's chunk: lane i // 16 of the row's quad, byte i % 16."""
    return tl.load(codes_ptr + tile_bytes + (i // 16) * 16 + i % 16)


@triton.jit
def _chunk_word(words_ptr, tile_bytes, w):
    """32-bit word w (0..15) of a row's chunk, through an int32 view of the codes (a lane's 16 bytes are 4 words)."""
    return tl.load(words_ptr + tile_bytes // 4 + (w // 4) * 4 + w % 4).to(tl.uint32, bitcast=True)


@triton.jit
def _dequantize_mma(codes_ptr, meta_ptr, meta2_ptr, block_scale_ptr, grid_ptr, sign_ptr, fields_ptr, row_factor_ptr,
                    out_ptr, N, K, CHUNKS, FMT: tl.constexpr, KB: tl.constexpr, META: tl.constexpr,
                    META2: tl.constexpr):  # fmt: skip
    """Rows 16·pid0 .. +16, chunk pid1 (KB columns) -> out (bf16, row stride K)."""
    tile = tl.program_id(0)
    c = tl.program_id(1)
    r = tl.arange(0, BLOCK_N)[:, None]  # row within the tile
    kk = tl.arange(0, KB)[None, :]  # column within the chunk
    n = tile * BLOCK_N + r
    k = c * KB + kk
    # byte 0 of row n's chunk c in the tile, and row n's scale bytes of chunk c
    tile_bytes = ((tile.to(tl.int64) * CHUNKS + c) * 2 + r // 8) * 512 + (r % 8) * 64
    row_meta = (tile.to(tl.int64) * CHUNKS + c) * 16 + r

    if FMT == FMT_FP8 or (FMT == FMT_FP8_BLOCK or FMT == FMT_MXFP8 or FMT == FMT_Q8_0):  # a byte per weight
        pos = kk % 4
        i = kk - pos + tl.where(pos == 1, 2, tl.where(pos == 2, 1, pos))  # e4m3 words [e0 e2 e1 e3]
        if FMT == FMT_Q8_0:
            i = kk  # offset binary, unpermuted
        byte = _chunk_byte(codes_ptr, tile_bytes, i)  # e4m3 formats: codes_ptr is an fp8 tensor
        if FMT == FMT_Q8_0:
            q = (byte ^ 128).to(tl.int8, bitcast=True).to(tl.float32)
            j = 2 * (kk // 32)  # fp16 d of the chunk's block kk // 32
            d = _fp16_of(tl.load(meta_ptr + row_meta * META + j), tl.load(meta_ptr + row_meta * META + j + 1))
            w = (q * d).to(tl.bfloat16).to(tl.float32)
        else:
            w = byte.to(tl.float32)
            if FMT == FMT_MXFP8:
                w = (w * e8m0_value(tl.load(meta_ptr + row_meta * META + kk // 32))).to(tl.bfloat16).to(tl.float32)
    elif FMT == FMT_NVFP4 or FMT == FMT_MXFP4:  # word w holds weights 8w .. 8w+7; pair p's bits at fields[4p..]
        tb3 = tl.expand_dims(tile_bytes, 2)
        word = _chunk_word(codes_ptr, tb3, tl.arange(0, KB // 8)[None, :, None])  # one load per 8 weights
        e = tl.arange(0, 8)[None, None, :]
        code = tl.zeros((BLOCK_N, KB // 8, 8), tl.int32)
        for bit in tl.static_range(4):  # magnitude bits 0-2, sign bit 3; the high element of a pair 16 bits up
            shift = (tl.load(fields_ptr + 4 * (e // 2) + bit) + (e % 2) * 16).to(tl.uint32)
            code |= ((word >> shift) & 1).to(tl.int32) << bit
        code = tl.reshape(code, (BLOCK_N, KB))
        if FMT == FMT_NVFP4:
            s = tl.load(meta_ptr + row_meta * META + kk // 16).to(tl.float32)  # meta_ptr: an fp8 tensor
        else:
            s = e8m0_value(tl.load(meta_ptr + row_meta * META + kk // 32))
        w = (e2m1_value(code) * s).to(tl.bfloat16).to(tl.float32)
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
        w = w * tl.load(block_scale_ptr + (n // FP8_BLOCK_SIZE) * kblocks + k // FP8_BLOCK_SIZE, mask=n < N, other=0.0)
    w = w * tl.load(row_factor_ptr + n, mask=n < N, other=0.0)
    tl.store(out_ptr + n.to(tl.int64) * K + k, w.to(tl.bfloat16), mask=(n < N) & (k < K))


def dequantize_mma(fmt: str, codes, meta, meta2, block_scale, grid_table, sign_table, fields, row_factor, out,
                   chunk_k: int, chunks: int) -> None:  # fmt: skip
    """out [n, K] bf16 (row stride K, written) = the weight in tensor_core.layout's layout, decoded as
    tiles.dequantize_tiles decodes the checkpoint layout, times row_factor [n] (float32: per-tensor factors).
    meta / meta2 / block_scale / the IQ2 tables: None where the format has none; fields: int32 [16]
    (tensor_core.layout.E2M1_FIELDS) for the FP4 formats."""
    if fmt not in FORMAT_IDS:
        raise ValueError(f"dequantize_mma: unknown format {fmt!r}; known {tuple(FORMAT_IDS)}")
    n, k = out.shape
    spec = codec_for(fmt).spec  # the format's facts, never its name
    if spec.packing != "ggml" and spec.bits_per_weight >= 8:  # e4m3 codes: loaded as fp8 (exact in the kernel)
        codes = codes.view(torch.float8_e4m3fn)
    if spec.block_scale_code == "e4m3":  # e4m3 block scales (NVFP4)
        meta = meta.view(torch.float8_e4m3fn)
    if spec.bits_per_weight < 8:  # sub-byte codes (E2M1, IQ2): read a word at a time
        codes = codes.view(torch.int32)
    dummy = row_factor
    padded_rows = triton.cdiv(n, BLOCK_N.value) * BLOCK_N.value
    meta_bytes = 0 if meta is None else meta.numel() // (padded_rows * chunks)
    meta2_bytes = 0 if meta2 is None else meta2.numel() // (padded_rows * chunks)
    grid = (triton.cdiv(n, BLOCK_N.value), chunks)
    _dequantize_mma[grid](
        codes, dummy if meta is None else meta, dummy if meta2 is None else meta2,
        dummy if block_scale is None else block_scale, dummy if grid_table is None else grid_table,
        dummy if sign_table is None else sign_table, dummy if fields is None else fields, row_factor, out, n, k, chunks,
        FMT=format_id(fmt), KB=chunk_k, META=meta_bytes, META2=meta2_bytes, num_warps=4,
    )  # fmt: skip
