"""bc.linear: every format × activation mode against float64 x̂ @ W.T, hand cases, errors, torch.compile.

Tolerance (documented in docs/api.md): the reference rounds once to bf16 after a float32 matmul, so
|y − y64| ≤ 2^-8·|y64| + 1e-5·(|x̂| @ |W|.T) elementwise (half a bf16 ulp, plus float32 accumulation).
"""

import ml_dtypes
import numpy as np
import pytest
import torch
from act_oracle import quantize as act_oracle

import b12x_core as bc
import b12x_formats as bf
from b12x_core import plan
from b12x_core.backends import DeviceInfo, Query

MODE = {  # (format, activation, has input_scale) -> the activation contract exercised
    ("FP8", "fp8", True): "fp8_static", ("FP8", "fp8", False): "fp8_token", ("FP8_BLOCK", "fp8", False): "fp8_group128",
    ("MXFP8", "mxfp8", False): "mxfp8", ("MXFP4", "mxfp8", False): "mxfp8", ("NVFP4", "mxfp8", False): "mxfp8",
    ("NVFP4", "nvfp4", True): "nvfp4",
}  # fmt: skip
CASES = [(f, "bf16", False) for f in bf.FORMATS] + list(MODE)


def make_weight(rng, fmt, n, k, with_input_scale, x):
    qw = bf.quantize((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32), fmt)
    if with_input_scale:
        amax = float(np.abs(x.float().numpy()).max())
        scale = amax / (6 * 448) if fmt.endswith("NVFP4") else amax / 448
        qw = bf.QuantizedWeight.from_tensors(fmt, {**qw.tensors, "input_scale": np.float32(scale)})
    return qw


@pytest.mark.parametrize("fmt,activation,with_scale", CASES, ids=lambda v: str(v))
def test_against_float64(rng, fmt, activation, with_scale):
    k = 512
    n = 136 if bf.spec(fmt).packing != "ggml" else 72  # not multiples of 128
    x = torch.from_numpy(rng.standard_normal((2, 3, k)).astype(np.float32)).to(torch.bfloat16)
    qw = make_weight(rng, fmt, n, k, with_scale, x)
    lin = bc.prepare_linear(qw, device="cpu", max_tokens=6, activation=activation)
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)
    y = bc.linear(x, lin, bias)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, n)
    mode = MODE.get((fmt, activation, with_scale), "bf16")
    scale = None if "input_scale" not in qw.tensors else float(qw.tensors["input_scale"])
    xh = act_oracle(x.float().numpy().reshape(6, k), mode, scale)
    w64 = bf.dequantize(qw).astype(np.float64)
    ref = xh @ w64.T + bias.float().numpy()
    bound = np.abs(xh) @ np.abs(w64).T
    err = np.abs(y.float().numpy().reshape(6, n) - ref)
    assert (err <= 2**-8 * np.abs(ref) + 1e-5 * bound + 1e-30).all(), err.max()
    assert torch.equal(bc.linear(x, lin, bias), y)  # deterministic
    assert torch.equal(torch.ops.b12x.linear(x, lin.handle, bias), y)


def test_hand_computed_q8_0_and_fp8():
    # Q8_0: one block, d = 0.5, q = 0..31; x = ones -> y = 0.5 * (0 + ... + 31) = 248
    block = np.zeros((1, 1, 34), np.uint8)
    block[0, 0, :2] = np.array([0.5], np.float16).view(np.uint8)
    block[0, 0, 2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    lin = bc.prepare_linear(bf.QuantizedWeight.from_tensors("Q8_0", {"weight": block}))
    assert bc.linear(torch.ones(1, 32, dtype=torch.bfloat16), lin).item() == 248.0
    # static FP8: w = [1, 2] * 2, x / 0.5 = [1.5, -2.5] exact -> y = 0.75*2 - 1.25*4 = -3.5
    t = {
        "weight": np.array([[1.0, 2.0]], np.float32).astype(ml_dtypes.float8_e4m3fn),
        "weight_scale": np.float32(2.0),
        "input_scale": np.float32(0.5),
    }
    lin = bc.prepare_linear(bf.QuantizedWeight.from_tensors("FP8", t), activation="fp8")
    assert lin.act_mode == "fp8_static"
    assert bc.linear(torch.tensor([[0.75, -1.25]], dtype=torch.bfloat16), lin).item() == -3.5


def test_errors(rng):
    qw = bf.quantize(rng.standard_normal((16, 256)).astype(np.float32), "IQ2_XS")
    lin = bc.prepare_linear(qw, max_tokens=4)
    with pytest.raises(bc.UnsupportedError, match="5 tokens, more than max_tokens=4"):
        bc.linear(torch.zeros(5, 256, dtype=torch.bfloat16), lin)
    with pytest.raises(bc.UnsupportedError, match=r"x \[2, 128\]: last dim must be K=256"):
        bc.linear(torch.zeros(2, 128, dtype=torch.bfloat16), lin)
    with pytest.raises(ValueError, match="x \\[2, 256\\] has dtype torch.float32; expected torch.bfloat16"):
        bc.linear(torch.zeros(2, 256), lin)
    with pytest.raises(ValueError, match="bias \\[8\\] must have N=16"):
        bc.linear(torch.zeros(2, 256, dtype=torch.bfloat16), lin, torch.zeros(8, dtype=torch.bfloat16))
    with pytest.raises(bc.UnsupportedError, match=r"IQ2_XS weights run with activations \['bf16'\], not 'fp8'"):
        bc.prepare_linear(qw, activation="fp8")
    nv = bf.quantize(rng.standard_normal((16, 256)).astype(np.float32), "NVFP4")
    with pytest.raises(bc.UnsupportedError, match="NVFP4 with nvfp4 activations needs the checkpoint's input_scale"):
        bc.prepare_linear(nv, activation="nvfp4")
    stacked = bf.quantize(rng.standard_normal((2, 16, 256)).astype(np.float32), "Q8_0")
    with pytest.raises(bc.UnsupportedError, match=r"linear weights are \[N, K\], got \[2, 16, 256\]"):
        bc.prepare_linear(stacked)
    with pytest.raises(ValueError, match="max_tokens must be a positive int"):
        bc.prepare_linear(qw, max_tokens=0)
    with pytest.raises(ValueError, match="takes a b12x_formats.QuantizedWeight"):
        bc.prepare_linear(torch.zeros(4, 4))


def test_cuda_never_falls_back_silently():
    """A CUDA device whose kernels cannot run refuses; the reference runs there only when asked for."""
    cuda = DeviceInfo(torch.device("cuda", 0), (9, 0), kernels="no CUDA device", triton="no CUDA device")
    query = Query("linear", "IQ2_XS", "bf16", "bf16", cuda, "auto", 64, 256, 16)
    with pytest.raises(bc.UnsupportedError, match="no b12x path runs linear IQ2_XS × bf16 on cuda:0.*path='reference'"):
        plan.choose(query)
    _, _, decisions = plan.choose(Query("linear", "IQ2_XS", "bf16", "bf16", cuda, "reference", 64, 256, 16))
    assert [d.backend.name for d in decisions] == ["reference"]


def test_prepare_refuses_during_graph_capture(rng, monkeypatch):
    qw = bf.quantize(rng.standard_normal((16, 256)).astype(np.float32), "Q8_0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="prepare_linear must run before CUDA graph capture"):
        bc.prepare_linear(qw)
    with pytest.raises(RuntimeError, match="prepare_embedding must run before CUDA graph capture"):
        bc.prepare_embedding(qw)


def test_torch_compile_fullgraph(rng):
    qw = bf.quantize(rng.standard_normal((32, 256)).astype(np.float32), "MXFP4")
    lin = bc.prepare_linear(qw, activation="mxfp8")
    x = torch.randn(4, 256, dtype=torch.bfloat16)

    def f(x):
        return bc.linear(torch.relu(x), lin) * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), f(x))


def test_explain_names_the_path(rng):
    lin = bc.prepare_linear(bf.quantize(rng.standard_normal((16, 256)).astype(np.float32), "IQ2_XXS"), max_tokens=8)
    assert "IQ2_XXS" in bc.explain(lin, 3) and "1-8 tokens -> reference" in bc.explain(lin, 3)
    assert "exceeds max_tokens=8" in bc.explain(lin, 16)


@pytest.mark.parametrize("fmt", ["FP8", "FP8_BLOCK", "MXFP8", "NVFP4"])
def test_auto_activation_reads_the_checkpoint_recipe(rng, fmt):
    """activation="auto": W8A8 for FP8 / FP8_BLOCK / MXFP8 checkpoints, W4A4 for NVFP4 with an input_scale,
    weight-only NVFP4 without one (the same numbers as asking for that activation)."""
    x = torch.from_numpy(rng.standard_normal((3, 256)).astype(np.float32)).to(torch.bfloat16)
    with_scale = fmt == "NVFP4" and rng.random() < 0.5
    qw = make_weight(rng, fmt, 32, 256, with_scale, x)
    expected = {"FP8": "fp8", "FP8_BLOCK": "fp8", "MXFP8": "mxfp8"}.get(fmt, "nvfp4" if with_scale else "bf16")
    auto = bc.prepare_linear(qw, activation="auto")
    assert auto.activation == expected
    assert torch.equal(bc.linear(x, auto), bc.linear(x, bc.prepare_linear(qw, activation=expected)))


@pytest.mark.parametrize("fmt,activation", [("FP8", "fp8"), ("NVFP4", "nvfp4"), ("IQ2_XS", "bf16")])
def test_row_shards_with_their_own_scales(rng, fmt, activation):
    """A fused layer whose shards carry different per-tensor scales runs as one layer, exactly."""
    k = 256
    x = torch.from_numpy(rng.standard_normal((3, k)).astype(np.float32)).to(torch.bfloat16)
    shards = [make_weight(rng, fmt, n, k, activation != "bf16", x * (i + 1)) for i, n in enumerate((64, 32, 32))]
    lin = bc.prepare_linear(shards, activation=activation)
    assert (lin.n, lin.k) == (128, k)
    scales = [float(s.tensors["input_scale"]) for s in shards if "input_scale" in s.tensors]
    assert lin.input_scale == (max(scales) if scales else None)
    mode = {"fp8": "fp8_static", "nvfp4": "nvfp4"}.get(activation, "bf16")
    xh = act_oracle(x.float().numpy(), mode, lin.input_scale)
    w64 = np.concatenate([bf.dequantize(s) for s in shards]).astype(np.float64)
    ref = xh @ w64.T
    err = np.abs(bc.linear(x, lin).float().numpy() - ref)
    assert (err <= 2**-8 * np.abs(ref) + 1e-5 * (np.abs(xh) @ np.abs(w64).T)).all()
    with pytest.raises(ValueError, match="row shards must share format"):
        bc.prepare_linear([shards[0], bf.quantize(rng.standard_normal((8, k)).astype(np.float32), "Q8_0")])
