"""Element decodes the Triton kernels share (the checkpoint-layout tiles and the tensor-core layout's decode):
one definition each, bit-exact, as Triton device functions."""

import triton
import triton.language as tl


@triton.jit
def e8m0_value(e):
    """uint8 E8M0 codes -> float32 2^(e-127), exactly (0 -> 2^-127): E8M0's bias is float32's exponent bias, so the
    code is the float's exponent field."""
    bits = (e.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    return tl.where(e == 0, 5.877471754111438e-39, bits)


@triton.jit
def e2m1_value(c):
    """4-bit E2M1 codes (int32) -> float32: 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives."""
    m = c & 7
    big = (2 + (m & 1)).to(tl.float32) * (1 << (m >> 1)).to(tl.float32) * 0.25
    mag = tl.where(m < 2, m.to(tl.float32) * 0.5, big)
    return tl.where((c & 8) != 0, -mag, mag)
