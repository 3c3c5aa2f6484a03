"""Quantizers follow their producers' rules, checked against independent implementations."""

import gguf
import numpy as np
import pytest
import torch
from producers import e2m1_codes, floor_log2, pack, smallest_pow2_exponent_at_least, torch_e4m3_bytes

import b12x_formats as bf


def as_bytes(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def gaussian(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def test_q8_0_bytes_identical_to_gguf(rng):
    w = gaussian(rng, 2, 40, 256)
    w[0, 0, :32] = 0  # an all-zero block
    w[0, 1, :32] = np.arange(32) - 15.5  # values at .5 after scaling exercise round-half-away
    ours = bf.quantize(w, "Q8_0").tensors["weight"]
    ref = gguf.quants.quantize(w.reshape(-1, 256), gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(ours.reshape(ref.shape), ref)


def test_fp8_per_tensor_follows_modelopt(rng):
    w = gaussian(rng, 3, 64, 96, scale=0.05)
    qw = bf.quantize(w, "FP8")
    scale = np.abs(w).max(axis=(1, 2)) / np.float32(448)
    np.testing.assert_array_equal(qw.tensors["weight_scale"], scale)
    np.testing.assert_array_equal(qw.tensors["weight"].view(np.uint8), torch_e4m3_bytes(w / scale[:, None, None]))


def test_fp8_block_follows_deepseek(rng):
    w = gaussian(rng, 200, 300)  # partial blocks on both axes
    qw = bf.quantize(w, "FP8_BLOCK")
    s = qw.tensors["weight_scale_inv"]
    assert s.shape == (2, 3)
    expected = np.empty_like(w)
    for i in range(2):
        for j in range(3):
            blk = w[128 * i : 128 * i + 128, 128 * j : 128 * j + 128]
            assert s[i, j] == np.abs(blk).max() / np.float32(448)
            expected[128 * i : 128 * i + 128, 128 * j : 128 * j + 128] = blk / s[i, j]
    np.testing.assert_array_equal(qw.tensors["weight"].view(np.uint8), torch_e4m3_bytes(expected))


def test_mxfp8_follows_modelopt(rng):
    w = gaussian(rng, 16, 128) * np.exp2(rng.integers(-20, 20, size=(16, 1))).astype(np.float32)
    w[0, :32] = 448.0 * 2.0**-3  # amax exactly 448·2^k: the exponent must not round up
    qw = bf.quantize(w, "MXFP8")
    blocks = w.reshape(16, 4, 32)
    exps = np.array([[smallest_pow2_exponent_at_least(float(np.abs(b).max()) / 448) for b in row] for row in blocks])
    np.testing.assert_array_equal(qw.tensors["weight_scale"], (exps + 127).astype(np.uint8))
    scaled = (blocks / np.exp2(exps)[..., None].astype(np.float32)).reshape(16, 128)
    np.testing.assert_array_equal(qw.tensors["weight"].view(np.uint8), torch_e4m3_bytes(scaled))


def test_mxfp4_follows_ocp(rng):
    w = gaussian(rng, 16, 128)
    w[1, :32] = 4.0  # amax exactly a power of two
    qw = bf.quantize(w, "MXFP4")
    blocks = w.reshape(16, 4, 32)
    exps = np.array([[floor_log2(float(np.abs(b).max())) - 2 for b in row] for row in blocks])
    np.testing.assert_array_equal(qw.tensors["weight_scale"], (exps + 127).astype(np.uint8))
    codes = e2m1_codes((blocks / np.exp2(exps)[..., None]).reshape(16, 128))
    np.testing.assert_array_equal(qw.tensors["weight"], pack(codes))


@pytest.mark.parametrize("fmt", ["NVFP4", "W4A16_NVFP4"])
def test_nvfp4_follows_modelopt(rng, fmt):
    w = gaussian(rng, 2, 32, 64)
    qw = bf.quantize(w, fmt)
    g = np.abs(w).max(axis=(1, 2)) / np.float32(6 * 448)
    np.testing.assert_array_equal(qw.tensors["weight_scale_2"], g.astype(np.float32))
    block_amax = np.abs(w).reshape(2, 32, 4, 16).max(-1)
    scale_bytes = torch_e4m3_bytes(block_amax / (np.float32(6) * g[:, None, None]))
    np.testing.assert_array_equal(qw.tensors["weight_scale"].view(np.uint8), scale_bytes)
    scale = torch.from_numpy(scale_bytes).view(torch.float8_e4m3fn).float().numpy()
    denom = np.repeat(scale, 16, axis=-1) * g[:, None, None]
    np.testing.assert_array_equal(qw.tensors["weight"], pack(e2m1_codes(w / denom)))


ALL = list(bf.FORMATS)
# relative RMS error bounds on Gaussian weights (element precision + scale granularity)
REL_RMSE = {"FP8": 0.04, "FP8_BLOCK": 0.04, "MXFP8": 0.05, "MXFP4": 0.15, "NVFP4": 0.12, "W4A16_NVFP4": 0.12,
            "Q8_0": 0.01, "IQ2_XXS": 0.36, "IQ2_XS": 0.31}  # fmt: skip


@pytest.mark.parametrize("fmt", ALL)
def test_roundtrip_error_and_expert_stacking(rng, fmt):
    w = gaussian(rng, 3, 48, 512, scale=0.02)
    qw = bf.quantize(w, fmt)
    assert qw.format == fmt and qw.shape == (3, 48, 512)
    back = bf.dequantize(qw)
    err = np.sqrt(np.mean((back - w) ** 2) / np.mean(w**2))
    assert err < REL_RMSE[fmt], err
    # stacked experts quantize exactly like each expert alone, per-tensor scales become [E]
    for e in range(3):
        alone = bf.quantize(w[e], fmt)
        for name, t in alone.tensors.items():
            np.testing.assert_array_equal(as_bytes(qw.tensors[name][e]), as_bytes(t))


@pytest.mark.parametrize("fmt", ["NVFP4", "IQ2_XS", "FP8"])
def test_torch_bf16_input_equals_numpy(rng, fmt):
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30)))).to(torch.bfloat16)
    from_torch = bf.quantize(w, fmt)
    from_numpy = bf.quantize(w.float().numpy(), fmt)
    for name in from_numpy.tensors:
        np.testing.assert_array_equal(as_bytes(from_torch.tensors[name]), as_bytes(from_numpy.tensors[name]))


def test_zero_and_tiny_weights_stay_finite(rng):
    for fmt in ALL:
        w = np.zeros((16, 256), np.float32)
        w[1] = 1e-30
        back = bf.dequantize(bf.quantize(w, fmt))
        assert np.isfinite(back).all(), fmt
        np.testing.assert_array_equal(back[0], 0)
