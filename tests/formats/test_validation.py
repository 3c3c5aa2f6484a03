"""Bad input raises ValueError naming the tensor, its shape and the rule it breaks."""

import ml_dtypes
import numpy as np
import pytest

import b12x_formats as bf


def valid(fmt, rng, lead=(), n=32, k=256):
    return dict(bf.quantize(rng.standard_normal((*lead, n, k)).astype(np.float32), fmt).tensors)


@pytest.mark.parametrize("fmt", [f for f in bf.FORMATS if bf.spec(f).k_multiple > 1])
def test_quantize_rejects_k_not_multiple_of_group(rng, fmt):
    group = bf.spec(fmt).k_multiple
    with pytest.raises(ValueError, match=rf"K={group + 8} .*not a multiple of the group size {group}"):
        bf.quantize(rng.standard_normal((4, group + 8)).astype(np.float32), fmt)


def test_quantize_rejects_bad_weights(rng):
    with pytest.raises(ValueError, match=r"\[..., N, K\]"):
        bf.quantize(np.ones(256, np.float32), "Q8_0")
    w = np.ones((2, 256), np.float32)
    w[1, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        bf.quantize(w, "NVFP4")
    with pytest.raises(ValueError, match="floating-point"):
        bf.quantize(np.ones((2, 256), np.int32), "FP8")
    with pytest.raises(ValueError, match="importance"):
        bf.quantize(np.ones((2, 256), np.float32), "IQ2_XS", importance=np.ones(128, np.float32))
    with pytest.raises(ValueError, match="importance must be finite and >= 0"):
        bf.quantize(np.ones((2, 256), np.float32), "IQ2_XS", importance=-np.ones(256, np.float32))


def test_unknown_format():
    with pytest.raises(ValueError, match="unknown weight format 'Q4_K'.*IQ2_XS"):
        bf.spec("Q4_K")


@pytest.mark.parametrize("fmt,block_bytes", [("IQ2_XS", 74), ("IQ2_XXS", 66), ("Q8_0", 34)])
def test_wrong_block_bytes(rng, fmt, block_bytes):
    w = valid(fmt, rng)["weight"]
    wrong = np.concatenate([w, w[..., :1]], axis=-1)  # one extra byte per block
    with pytest.raises(
        ValueError, match=rf"'weight' has shape \[32, \d+, {block_bytes + 1}\]; expected \[32, \d+, {block_bytes}\]"
    ):
        bf.QuantizedWeight.from_tensors(fmt, {"weight": wrong})
    with pytest.raises(ValueError, match="raw GGML blocks"):
        bf.QuantizedWeight.from_tensors(fmt, {"weight": w.reshape(32, -1)})


@pytest.mark.parametrize("fmt", ["IQ2_XS", "IQ2_XXS", "Q8_0"])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_d_rejected(rng, fmt, bad):
    w = valid(fmt, rng, lead=(2,))["weight"].copy()
    w[1, 5, 0, :2] = np.array([bad], np.float16).view(np.uint8)
    with pytest.raises(ValueError, match=rf"{fmt}: tensor 'weight' .*non-finite block scale d .* block \(1, 5, 0\)"):
        bf.QuantizedWeight.from_tensors(fmt, {"weight": w})


@pytest.mark.parametrize("fmt", ["MXFP4", "MXFP8"])
def test_e8m0_nan_scale_rejected(rng, fmt):
    t = valid(fmt, rng)
    t["weight_scale"] = t["weight_scale"].copy()
    t["weight_scale"][3, 2] = 0xFF
    with pytest.raises(ValueError, match=r"'weight_scale' .*E8M0 NaN code 0xFF at index \(3, 2\)"):
        bf.QuantizedWeight.from_tensors(fmt, t)


@pytest.mark.parametrize(
    "fmt,name",
    [("FP8", "weight_scale"), ("FP8_BLOCK", "weight_scale_inv"), ("NVFP4", "weight_scale_2"), ("FP8", "input_scale")],
)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_fp32_scales_rejected(rng, fmt, name, bad):
    t = valid(fmt, rng)
    t[name] = np.full(np.shape(t.get(name, np.float32(1))), bad, np.float32)
    with pytest.raises(ValueError, match=rf"'{name}' .*non-finite"):
        bf.QuantizedWeight.from_tensors(fmt, t)


def test_negative_scale_rejected(rng):
    t = valid("FP8", rng)
    t["weight_scale"] = np.float32(-1)
    with pytest.raises(ValueError, match="'weight_scale' .*negative scale"):
        bf.QuantizedWeight.from_tensors("FP8", t)


@pytest.mark.parametrize("fmt,name", [("NVFP4", "weight_scale"), ("FP8", "weight"), ("MXFP8", "weight")])
def test_e4m3_nan_codes_rejected(rng, fmt, name):
    t = valid(fmt, rng)
    t[name] = t[name].copy()
    t[name].view(np.uint8)[1, 1] = 0x7F
    with pytest.raises(ValueError, match=rf"'{name}' .*E4M3 NaN code"):
        bf.QuantizedWeight.from_tensors(fmt, t)


@pytest.mark.parametrize(
    "fmt,name,dtype",
    [("FP8", "weight", np.uint8), ("NVFP4", "weight_scale", np.uint8), ("NVFP4", "weight", np.int8),
     ("MXFP4", "weight_scale", np.float32), ("Q8_0", "weight", np.int8), ("FP8_BLOCK", "weight_scale_inv", np.float16)],
)  # fmt: skip
def test_wrong_dtype(rng, fmt, name, dtype):
    t = valid(fmt, rng)
    t[name] = (
        np.asarray(t[name]).view(np.uint8).astype(dtype) if np.dtype(dtype).itemsize == 1 else t[name].astype(dtype)
    )
    with pytest.raises(ValueError, match=rf"'{name}' .*has dtype {np.dtype(dtype).name}; expected"):
        bf.QuantizedWeight.from_tensors(fmt, t)


@pytest.mark.parametrize(
    "fmt,name,shape",
    [("NVFP4", "weight_scale", (32, 15)), ("MXFP4", "weight_scale", (31, 8)), ("MXFP8", "weight_scale", (32, 7)),
     ("FP8_BLOCK", "weight_scale_inv", (1, 1)), ("NVFP4", "weight_scale_2", (3,)), ("FP8", "weight_scale", (2, 1))],
)  # fmt: skip
def test_wrong_shape(rng, fmt, name, shape):
    t = valid(fmt, rng, n=32, k=256)
    t[name] = np.zeros(shape, dtype=np.asarray(t[name]).dtype)
    with pytest.raises(ValueError, match=rf"'{name}' has shape \[{', '.join(map(str, shape))}\]; expected"):
        bf.QuantizedWeight.from_tensors(fmt, t)


def test_missing_and_unknown_tensors(rng):
    t = valid("NVFP4", rng)
    with pytest.raises(ValueError, match=r"missing tensor\(s\) \['weight_scale_2'\]"):
        bf.QuantizedWeight.from_tensors("NVFP4", {k: v for k, v in t.items() if k != "weight_scale_2"})
    with pytest.raises(ValueError, match=r"unexpected tensor\(s\) \['bias'\]"):
        bf.QuantizedWeight.from_tensors("NVFP4", {**t, "bias": np.zeros(32, np.float32)})


def test_from_tensors_rejects_k_not_multiple(rng):
    w = np.zeros((4, 24), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="K=24 is not a multiple of 32"):
        bf.QuantizedWeight.from_tensors("MXFP8", {"weight": w, "weight_scale": np.zeros((4, 0), np.uint8)})


def test_dequantize_revalidates(rng):
    qw = bf.quantize(rng.standard_normal((8, 256)).astype(np.float32), "Q8_0")
    qw.tensors["weight"][0, 0, :2] = np.array([np.nan], np.float16).view(np.uint8)
    with pytest.raises(ValueError, match="non-finite block scale d"):
        bf.dequantize(qw)
