"""Dequantization is exact: GGML codecs bit-identical to gguf.quants.dequantize, the others to ml_dtypes."""

import gguf
import ml_dtypes
import numpy as np
import pytest
from oracles import decode

import b12x_formats as bf

GGML = ["IQ2_XS", "IQ2_XXS", "Q8_0"]


def random_ggml_blocks(rng, fmt, lead, n, k):
    s = bf.spec(fmt)
    blocks = rng.integers(0, 256, size=(*lead, n, k // s.group_size, s.block_bytes), dtype=np.uint8)
    d = (rng.standard_normal(blocks.shape[:-1]) * 0.01).astype(np.float16)  # any finite fp16
    blocks[..., :2] = d[..., None].view(np.uint8).reshape(*blocks.shape[:-1], 2)
    return blocks


@pytest.mark.parametrize("fmt", GGML)
@pytest.mark.parametrize("lead", [(), (3,)])
def test_ggml_random_blocks_bit_identical_to_gguf(rng, fmt, lead):
    blocks = random_ggml_blocks(rng, fmt, lead, 24, 512)
    qw = bf.QuantizedWeight.from_tensors(fmt, {"weight": blocks})
    assert qw.shape == (*lead, 24, 512)
    ours = bf.dequantize(qw)
    ref = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[fmt]).reshape(ours.shape)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


def random_tensors(rng, fmt, lead, n, k):
    """Valid random checkpoint tensors of every non-GGML format (every code, including subnormals)."""

    def e4m3_codes(shape, positive=False):
        c = rng.integers(0, 256, size=shape, dtype=np.uint8)
        c[(c & 0x7F) == 0x7F] = 0x3C  # NaN codes are invalid data
        if positive:
            c &= 0x7F
        return c.view(ml_dtypes.float8_e4m3fn)

    def e8m0_codes(shape):
        return rng.integers(100, 150, size=shape, dtype=np.uint8)

    scalar = np.float32(rng.uniform(0.5, 2.0)) * np.ones(lead, np.float32)
    if fmt == "FP8":
        return {"weight": e4m3_codes((*lead, n, k)), "weight_scale": scalar}
    if fmt == "FP8_BLOCK":
        sb = rng.uniform(0.01, 1, size=(*lead, -(-n // 128), -(-k // 128))).astype(np.float32)
        return {"weight": e4m3_codes((*lead, n, k)), "weight_scale_inv": sb}
    if fmt == "MXFP8":
        return {"weight": e4m3_codes((*lead, n, k)), "weight_scale": e8m0_codes((*lead, n, k // 32))}
    if fmt == "MXFP4":
        packed = rng.integers(0, 256, size=(*lead, n, k // 2), dtype=np.uint8)
        return {"weight": packed, "weight_scale": e8m0_codes((*lead, n, k // 32))}
    packed = rng.integers(0, 256, size=(*lead, n, k // 2), dtype=np.uint8)
    return {"weight": packed, "weight_scale": e4m3_codes((*lead, n, k // 16), positive=True), "weight_scale_2": scalar}


NON_GGML = ["FP8", "FP8_BLOCK", "MXFP8", "MXFP4", "NVFP4", "W4A16_NVFP4"]


@pytest.mark.parametrize("fmt", NON_GGML)
@pytest.mark.parametrize("lead", [(), (2,)])
def test_element_formats_bit_identical_to_ml_dtypes(rng, fmt, lead):
    k = 320 if fmt == "FP8_BLOCK" else 256  # FP8_BLOCK: a partial 128-block along K and N
    tensors = random_tensors(rng, fmt, lead, 136, k)
    ours = bf.dequantize(bf.QuantizedWeight.from_tensors(fmt, tensors))
    ref = decode(fmt, tensors)
    assert ours.dtype == np.float32 and ours.shape == (*lead, 136, k)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_per_tensor_scale_accepts_scalar_or_per_expert(rng):
    t = random_tensors(rng, "NVFP4", (3,), 16, 64)
    np.testing.assert_array_equal(bf.dequantize(bf.QuantizedWeight.from_tensors("NVFP4", t)), decode("NVFP4", t))
    for scalar in (np.float32(0.75), np.array([0.75], np.float32), np.array(0.75, np.float32)):
        one = bf.dequantize(bf.QuantizedWeight.from_tensors("NVFP4", {**t, "weight_scale_2": scalar}))
        np.testing.assert_array_equal(one, decode("NVFP4", {**t, "weight_scale_2": np.float32(0.75)}))


def test_torch_tensors_are_accepted(rng):
    torch = pytest.importorskip("torch")
    t = random_tensors(rng, "NVFP4", (), 32, 64)
    as_torch = {
        "weight": torch.from_numpy(t["weight"]),
        "weight_scale": torch.from_numpy(t["weight_scale"].view(np.uint8)).view(torch.float8_e4m3fn),
        "weight_scale_2": torch.tensor(float(t["weight_scale_2"])),
    }
    np.testing.assert_array_equal(
        bf.dequantize(bf.QuantizedWeight.from_tensors("NVFP4", as_torch)),
        bf.dequantize(bf.QuantizedWeight.from_tensors("NVFP4", t)),
    )
