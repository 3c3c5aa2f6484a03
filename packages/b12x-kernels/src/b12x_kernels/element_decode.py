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
def e2m1_bits_value(m, negative):
    """E2M1 magnitude codes m (0-7, int32) and sign flags (0/1) -> float32: for m ≥ 2 the code is the float's low
    exponent bits and top mantissa bit over a bias of 126 (2 -> 1.0, 7 -> 6.0); 0 and 1 (0, 0.5) by a multiply; the
    sign as the sign bit (so a negative zero stays -0.0). Integer work only, a few operations a weight."""
    bits = tl.where(m < 2, m * 0x3F000000, (m << 22) + 0x3F000000)
    return (bits | (negative << 31)).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_value(c):
    """4-bit E2M1 codes (int32) -> float32: 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives; code 8 is -0.0, as the format's
    oracle has it (a negation would give +0 in compiled code: Triton negates as 0 - x)."""
    return e2m1_bits_value(c & 7, (c >> 3) & 1)
