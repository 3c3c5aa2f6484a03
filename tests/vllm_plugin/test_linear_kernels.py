"""b12x's kernels inside vLLM's own linear-kernel selection: where they sit in the candidate lists, what they
say off CUDA, and that each adapts the layer layout vLLM's methods leave (checked on CPU, where b12x_core runs
its reference, against a float64 matmul of the weights decoded from that layout independently)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from b12x_core.activations import quantize_activation  # noqa: E402
from b12x_vllm import linear_kernels  # noqa: E402

LISTS = linear_kernels._CANDIDATE_LISTS


@pytest.fixture(autouse=True)
def vllm_config():
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig("cpu"))):
        yield


def test_candidates_sit_after_established_backends_and_before_emulation():
    from vllm.model_executor.kernels import linear as kernels
    from vllm.platforms import PlatformEnum

    classes = linear_kernels.install()
    assert linear_kernels.install() is classes  # idempotent
    for family, cls in classes.items():
        candidates = getattr(kernels, LISTS[family])[PlatformEnum.CUDA]
        assert candidates.count(cls) == 1, family
        at = candidates.index(cls)
        emulation = [i for i, c in enumerate(candidates) if c.__name__.startswith("Emulation")]
        assert at == (emulation[0] - 1 if emulation else len(candidates) - 1), (family, candidates)
        assert at > 0, family  # established backends come first
        assert cls in kernels._LINEAR_BACKEND_KERNEL_MAP["b12x"]


def test_off_cuda_they_say_why():
    for cls in linear_kernels.install().values():
        ok, why = cls.is_supported()
        assert not ok and "CUDA" in why


def e4m3(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def e2m1(packed: torch.Tensor) -> np.ndarray:
    values = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    b = packed.numpy()
    return np.stack([values[b & 15], values[b >> 4]], axis=-1).reshape(b.shape[0], -1)


def run(cls, config, layer, x, **init):
    kernel_cls = type(cls.__name__, (cls,), {"is_supported": classmethod(lambda c, cc=None: (True, None))})
    kernel = kernel_cls(config, **init)
    kernel.process_weights_after_loading(layer)
    return kernel.apply_weights(layer, x).float().numpy()


def check(y, xh, w64):
    ref = xh.astype(np.float64) @ w64.T
    assert (np.abs(y - ref) <= 2**-7 * np.abs(ref) + 1e-3 * np.abs(ref).mean() + 1e-30).all()


@pytest.fixture
def x(rng):
    return torch.from_numpy(rng.standard_normal((5, 256)).astype(np.float32)).to(torch.bfloat16)


@pytest.mark.parametrize("static", [True, False])
def test_fp8_per_tensor(rng, x, static):
    from vllm.model_executor.kernels.linear import FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8DynamicTokenSym, kFp8StaticTensorSym

    layer = torch.nn.Module()
    w = torch.from_numpy(rng.standard_normal((96, 256)).astype(np.float32) * 50).to(torch.float8_e4m3fn)
    layer.weight = torch.nn.Parameter(w.t(), requires_grad=False)  # vLLM's FP8 methods leave [K, N]
    layer.weight_scale = torch.nn.Parameter(torch.tensor(0.002), requires_grad=False)
    layer.input_scale = torch.nn.Parameter(torch.tensor(float(x.float().abs().max()) / 448), requires_grad=False)
    act = kFp8StaticTensorSym if static else kFp8DynamicTokenSym
    config = FP8ScaledMMLinearLayerConfig(weight_quant_key=kFp8StaticTensorSym, activation_quant_key=act,
                                          weight_shape=(96, 256), input_dtype=torch.bfloat16,
                                          out_dtype=torch.bfloat16)  # fmt: skip
    cls = linear_kernels.install()["fp8"]
    y = run(cls, config, layer, x, layer_param_names=["weight", "weight_scale", "input_scale", "input_scale_ub"])
    mode, scale = ("fp8_static", float(layer.input_scale)) if static else ("fp8_token", None)
    check(y, quantize_activation(x.float(), mode, scale).numpy(), e4m3(w) * 0.002)


def test_fp8_blocks(rng, x):
    from vllm.model_executor.kernels.linear import FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8Dynamic128Sym, kFp8Static128BlockSym

    layer = torch.nn.Module()
    w = torch.from_numpy(rng.standard_normal((200, 256)).astype(np.float32) * 50).to(torch.float8_e4m3fn)
    scale = torch.from_numpy(rng.uniform(1e-3, 3e-3, (2, 2)).astype(np.float32))
    layer.weight = torch.nn.Parameter(w, requires_grad=False)
    layer.weight_scale_inv = torch.nn.Parameter(scale, requires_grad=False)
    config = FP8ScaledMMLinearLayerConfig(weight_quant_key=kFp8Static128BlockSym, activation_quant_key=kFp8Dynamic128Sym,
                                          weight_shape=(200, 256), input_dtype=torch.bfloat16,
                                          out_dtype=torch.bfloat16)  # fmt: skip
    cls = linear_kernels.install()["fp8_block"]
    kernel_cls = type(cls.__name__, (cls,), {"is_supported": classmethod(lambda c, cc=None: (True, None))})
    kernel = kernel_cls(config)
    kernel.process_weights_after_loading(layer)
    y = kernel.apply_weights(layer, x).float().numpy()
    w64 = e4m3(w) * np.repeat(np.repeat(scale.numpy(), 128, 0), 128, 1)[:200].astype(np.float64)
    check(y, quantize_activation(x.float(), "fp8_group128").numpy(), w64)


def test_mxfp8(rng, x):
    from vllm.model_executor.kernels.linear import Mxfp8LinearLayerConfig

    layer = torch.nn.Module()
    w = torch.from_numpy(rng.standard_normal((64, 256)).astype(np.float32) * 50).to(torch.float8_e4m3fn)
    codes = torch.from_numpy(rng.integers(115, 125, (64, 8)).astype(np.uint8))
    layer.weight = torch.nn.Parameter(w, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(codes, requires_grad=False)
    y = run(linear_kernels.install()["mxfp8"], Mxfp8LinearLayerConfig(weight_shape=(64, 256)), layer, x)
    w64 = e4m3(w) * np.repeat(2.0 ** (codes.numpy().astype(np.float64) - 127), 32, axis=1)
    check(y, quantize_activation(x.float(), "mxfp8").numpy(), w64)


@pytest.mark.parametrize("w4a4", [True, False])
def test_nvfp4(rng, x, w4a4):
    from vllm.model_executor.kernels.linear import NvFp4LinearLayerConfig

    layer = torch.nn.Module()
    packed = torch.from_numpy(rng.integers(0, 256, (64, 128)).astype(np.uint8))
    sf = torch.from_numpy(rng.uniform(0.5, 4, (64, 16)).astype(np.float32)).to(torch.float8_e4m3fn)
    layer.weight = torch.nn.Parameter(packed, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(sf, requires_grad=False)
    layer.weight_global_scale = torch.nn.Parameter(torch.tensor(0.01), requires_grad=False)
    input_scale = float(x.float().abs().max()) / (6 * 448)
    if w4a4:  # what vLLM's NVFP4 activation scheme leaves
        layer.input_global_scale = torch.nn.Parameter(torch.tensor(input_scale), requires_grad=False)
    y = run(linear_kernels.install()["nvfp4"], NvFp4LinearLayerConfig(), layer, x)
    w64 = e2m1(packed) * np.repeat(e4m3(sf), 16, axis=1) * 0.01
    xh = quantize_activation(x.float(), "nvfp4", input_scale) if w4a4 else x.float()
    check(y, xh.numpy(), w64)


@pytest.mark.parametrize("mxfp8_activations", [False, True])
def test_mxfp4(rng, x, mxfp8_activations):
    from vllm.model_executor.kernels.linear import MxFp4LinearLayerConfig
    from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp8Dynamic

    layer = torch.nn.Module()
    packed = torch.from_numpy(rng.integers(0, 256, (64, 128)).astype(np.uint8))
    codes = torch.from_numpy(rng.integers(115, 125, (64, 8)).astype(np.uint8))
    layer.weight = torch.nn.Parameter(packed, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(codes, requires_grad=False)
    config = MxFp4LinearLayerConfig(activation_quant_key=kMxfp8Dynamic if mxfp8_activations else None)
    y = run(linear_kernels.install()["mxfp4"], config, layer, x)
    w64 = e2m1(packed) * np.repeat(2.0 ** (codes.numpy().astype(np.float64) - 127), 32, axis=1)
    xh = quantize_activation(x.float(), "mxfp8") if mxfp8_activations else x.float()
    check(y, xh.numpy(), w64)
