"""Activation quantization matches its written contract (an independent ml_dtypes oracle) and hand values."""

import numpy as np
import pytest
import torch
from act_oracle import quantize as oracle

from b12x_core.activations import MODES, quantize_activation, round_e2m1, round_e4m3


def test_round_e2m1_and_e4m3_match_ml_dtypes():
    import ml_dtypes

    v = torch.linspace(-8, 8, 320001)
    np.testing.assert_array_equal(round_e2m1(v).numpy(), v.numpy().astype(ml_dtypes.float4_e2m1fn).astype(np.float32))
    w = torch.randn(200000) * 300
    np.testing.assert_array_equal(
        round_e4m3(w).numpy(), np.clip(w.numpy(), -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    )


@pytest.mark.parametrize("mode", MODES)
def test_modes_match_oracle(rng, mode):
    x = (rng.standard_normal((5, 200)) * np.exp2(rng.integers(-6, 6, size=(5, 1)))).astype(np.float32)
    x[2, :40] = 0  # all-zero groups
    x = torch.from_numpy(x).to(torch.bfloat16)
    scale = float(np.abs(x.float().numpy()).max() / (6 * 448)) if mode == "nvfp4" else 0.03
    ours = quantize_activation(x, mode, scale).numpy()
    ref = oracle(x.float().numpy(), mode, scale)
    np.testing.assert_array_equal(ours.astype(np.float64), ref.astype(np.float32).astype(np.float64))


def test_hand_computed_values():
    # MXFP8: amax 3 -> X = 2^(1-8); 1.1 * 128 = 140.8 rounds to E4M3 144 -> 1.125; -0.7 * 128 = -89.6 -> -88
    x = torch.tensor([[3.0, 1.1, -0.7] + [0.0] * 29])
    np.testing.assert_array_equal(quantize_activation(x, "mxfp8")[0, :3].numpy(), [3.0, 1.125, -0.6875])
    # NVFP4 with input_scale 1: sf = e4m3(3/6) = 0.5, x/sf = 6, 2.2 -> 2, -1.4 -> -1.5
    x = torch.tensor([[3.0, 1.1, -0.7, 0.1] + [0.0] * 12])
    np.testing.assert_array_equal(quantize_activation(x, "nvfp4", 1.0)[0, :4].numpy(), [3.0, 1.0, -0.75, 0.0])
    # static FP8: x / 0.5 = 1.5, -2.5 are E4M3 values: exact
    x = torch.tensor([[0.75, -1.25]])
    np.testing.assert_array_equal(quantize_activation(x, "fp8_static", 0.5).numpy(), [[0.75, -1.25]])
    with pytest.raises(ValueError, match="need the checkpoint's input_scale"):
        quantize_activation(x, "nvfp4")
