"""The shared-memory contract of the warp-specialized Hopper GEMM (csrc/wgmma_ws_gemm.cuh), on CPU: where its decoding
warpgroup stores each weight element, where stage_x_kernel stores each activation (64-column sub-chunks), and where the
SS wgmmas' descriptors then read them, per PTX ISA's canonical K-major layout without swizzle (core matrices of 8 rows
× 16 bytes; LBO = the distance between the two K halves, SBO = between groups of 8 rows). The property: every k16 step
pairs an A element (weight row, column) with B elements (token, the same column), the rows and tokens are the ones
store_tile writes for that warp, and each step pair covers the chunk's columns once.

The addresses below are the kernel's formulas written again (it has no CPU form); what is independent is PTX's
layout rule, and the composition the test checks. It fails if either side of the pairing moves alone.
"""

from __future__ import annotations

import pytest

from b12x_kernels.interface import chunk_k

SUB = 64  # columns per stage (kSubK)
STEPS = SUB // 16
A_HALF = 64 * 16 * 2  # one row half's one k16 step: 8 row groups × 256 bytes
X_GROUP = SUB * 16  # a group of 8 tokens of one staged sub-chunk
E_OF = {"FP8": 16, "MXFP8": 16, "Q8_0": 16, "NVFP4": 32, "MXFP4": 32}  # lane elements per chunk (mma_gemm.cuh)


def canonical(row: int, kk: int, start: int, lbo: int, sbo: int) -> int:
    """Byte address of element (row, kk) of a K-major operand without swizzle (PTX ISA 9.7.15.5.1.2)."""
    return start + (row // 8) * sbo + (kk // 8) * lbo + (row % 8) * 16 + (kk % 8) * 2


def decoded_a(fmt: str, chunk: int) -> dict[int, dict[int, tuple[int, int]]]:
    """Per A stage (stage index within the chunk): byte address -> (row of the CTA's 128, column of K) the decoding
    warps store (wgmma_ws_gemm.cuh's decode loop: warp w, tiles 2w, 2w+1 into halves 0, 1; decode8<g> gives lane
    elements 8g..8g+7 of rows q and q+8 as lo[0..3], hi[0..3], a pair each)."""
    kb, e = chunk_k(fmt), E_OF[fmt]
    h_count, gps = kb // SUB, e // 8 // (kb // SUB)
    stages = {h: {} for h in range(h_count)}
    for w in range(4):
        for r in range(2):
            for lane in range(32):
                q, t = lane // 4, lane % 4
                for h in range(h_count):
                    base = (2 * w) * 256 + 16 * q + 4 * t
                    for g_in in range(gps):
                        g = h * gps + g_in
                        for u in range(2):
                            step = base + (r * STEPS + 2 * g_in + u) * A_HALF
                            # (address, row offset, fragment index i: elements 8g + 2i, +1)
                            for addr, row_off, i in ((step, 0, 2 * u), (step + 256, 8, 2 * u),
                                                     (step + 128, 0, 2 * u + 1), (step + 384, 8, 2 * u + 1)):  # fmt: skip
                                row = 16 * (2 * w + r) + q + row_off
                                for half in range(2):
                                    col = chunk * kb + e * t + 8 * g + 2 * i + half
                                    stages[h][addr + 2 * half] = (row, col)
    return stages


def staged_x(fmt: str, m: int, chunks: int) -> dict[int, tuple[int, int]]:
    """stage_x_kernel<F, 64>: byte address in the staged buffer -> (token, column)."""
    kb, e = chunk_k(fmt), E_OF[fmt]
    groups, sb = -(-m // 8), SUB // 16
    out = {}
    for c in range(chunks):
        for tok in range(groups * 8):
            for pc in range(kb // 8):
                e0 = 8 * pc
                t, s0 = e0 // e, (e0 % e) // 4
                h, sl = s0 // sb, s0 % sb
                block = ((c * (kb // SUB) + h) * groups + tok // 8) * X_GROUP + 16 * (tok % 8) + 4 * t
                for i in range(4):  # v.x, v.y, v.z, v.w: steps sl, sl (K half 1), sl + 1, sl + 1 (K half 1)
                    addr = block + (2 * sl + i) * 128
                    for half in range(2):
                        out[addr + 2 * half] = (tok, c * kb + e0 + 2 * i + half)
    return out


@pytest.mark.parametrize("fmt", ["FP8", "NVFP4"])
@pytest.mark.parametrize("mt", [8, 32])
def test_every_step_pairs_weights_and_activations_of_the_same_column(fmt, mt):
    kb = chunk_k(fmt)
    chunks = 2
    m = 8 * mt  # one whole token tile
    x = staged_x(fmt, m, chunks)
    groups = m // 8
    for chunk in range(chunks):
        a_stages = decoded_a(fmt, chunk)
        seen = []  # per stage and warpgroup: the columns its steps multiplied
        for h, a in a_stages.items():
            x_start = (chunk * (kb // SUB) + h) * groups * X_GROUP  # the CTA's tokens: one contiguous copy
            for u in range(2):  # multiplying warpgroup u: A half u, every token of the CTA
                seen.append((h, set()))
                for k in range(STEPS):
                    for j in range(4):  # warp j holds rows 16j.. of the m64 half: row tile 2j + u (store_tile's)
                        for i in range(16):
                            for kk in range(16):
                                row, col = a[canonical(16 * j + i, kk, (u * STEPS + k) * A_HALF, 128, 256)]
                                assert row == 16 * (2 * j + u) + i
                                for n in range(0, m, 7):
                                    tok, xcol = x[x_start + canonical(n, kk, k * 256, 128, X_GROUP)]
                                    assert (tok, xcol) == (n, col)
                                if j == 0 and i == 0:
                                    seen[-1][1].add(col)
        # each stage 64 columns; both warpgroups the same ones; the chunk's stages together all of its columns once
        per_stage = {h: cols for h, cols in seen}
        assert all(len(cols) == SUB and cols == per_stage[h] for h, cols in seen)
        assert sum(len(c) for c in per_stage.values()) == kb
        assert set().union(*per_stage.values()) == set(range(chunk * kb, (chunk + 1) * kb))


def test_fp4_stages_split_each_lanes_elements():
    """FP4's 128-column chunk is two stages; together they hold every column of the chunk once."""
    a = decoded_a("NVFP4", 0)
    cols = [{col for row, col in stage.values() if row == 0} for stage in a.values()]
    assert len(cols) == 2 and not cols[0] & cols[1] and cols[0] | cols[1] == set(range(128))
