"""slice_weight / concat_rows: exact, on block boundaries only, for every format."""

import numpy as np
import pytest

import b12x_formats as bf


@pytest.mark.parametrize("fmt", bf.FORMATS)
def test_slices_equal_slices_of_the_dequantized_weight(rng, fmt):
    w = rng.standard_normal((2, 300, 768)).astype(np.float32)
    qw = bf.quantize(w, fmt)
    full = bf.dequantize(qw)
    row_step = 128 if fmt == "FP8_BLOCK" else 1
    col_step = {"FP8": 1, "FP8_BLOCK": 128}.get(fmt, bf.spec(fmt).k_multiple)
    r0 = row_step * int(rng.integers(0, 2))
    rows = (r0, int(rng.choice([r0 + 128, 300])))
    cols = (col_step * int(rng.integers(0, 2)), 768 - col_step * int(rng.integers(0, 2)))
    part = bf.slice_weight(qw, rows=rows, cols=cols)
    assert part.shape == (2, rows[1] - rows[0], cols[1] - cols[0])
    np.testing.assert_array_equal(bf.dequantize(part), full[:, rows[0] : rows[1], cols[0] : cols[1]])
    top, bottom = bf.slice_weight(qw, rows=(0, 128)), bf.slice_weight(qw, rows=(128, 300))
    np.testing.assert_array_equal(bf.dequantize(bf.concat_rows([top, bottom])), full)


@pytest.mark.parametrize("fmt,cut,unit", [("IQ2_XXS", 128, 256), ("Q8_0", 16, 32), ("NVFP4", 8, 16), ("MXFP4", 1, 2)])
def test_cuts_inside_a_block_are_refused(rng, fmt, cut, unit):
    qw = bf.quantize(rng.standard_normal((4, 512)).astype(np.float32), fmt)
    with pytest.raises(ValueError, match=f"cannot cut cols at {cut}: .* stores {unit} cols per entry"):
        bf.slice_weight(qw, cols=(cut, 512))


def test_fp8_block_rows_and_range_errors(rng):
    qw = bf.quantize(rng.standard_normal((300, 256)).astype(np.float32), "FP8_BLOCK")
    with pytest.raises(ValueError, match="cannot cut rows at 64: tensor 'weight_scale_inv' stores 128 rows per entry"):
        bf.slice_weight(qw, rows=(64, 300))
    with pytest.raises(ValueError, match="out of range"):
        bf.slice_weight(qw, rows=(0, 400))
    other = bf.quantize(rng.standard_normal((300, 256)).astype(np.float32) * 3, "FP8")
    with pytest.raises(ValueError, match="per-tensor 'weight_scale' differs"):
        bf.concat_rows([bf.quantize(rng.standard_normal((8, 256)).astype(np.float32), "FP8"), other])


def test_per_tensor_names_come_from_the_codec():
    from b12x_formats.quantized import codec_for

    expected = {"FP8": ("weight_scale", "input_scale"), "NVFP4": ("weight_scale_2", "input_scale"),
                "W4A16_NVFP4": ("weight_scale_2", "input_scale")}  # fmt: skip
    for fmt in bf.FORMATS:
        assert codec_for(fmt).per_tensor_names() == expected.get(fmt, ()), fmt
