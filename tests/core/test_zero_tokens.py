"""Zero tokens (an empty batch) give empty outputs for every op, format and activation mode (the
quantized-activation modes used to fail with "cannot reshape tensor of 0 elements")."""

import numpy as np
import pytest
import torch
from test_linear import CASES, make_weight
from test_moe import MOE_CASES, experts

import b12x_core as bc
import b12x_formats as bf
from b12x_core.activations import MODES, fp8_operands, quantize_activation


@pytest.mark.parametrize("mode", MODES)
def test_activation_quantizers_take_zero_tokens(mode):
    x = torch.empty(0, 256, dtype=torch.bfloat16)
    out = quantize_activation(x, mode, 0.01)
    assert out.shape == (0, 256) and out.dtype == torch.float32
    if mode.startswith("fp8"):
        q, row, group = fp8_operands(x, mode, 0.01)
        assert q.shape == (0, 256)
        assert (row is None or row.shape == (0,)) and (group is None or group.shape == (0, 2))


@pytest.mark.parametrize("fmt,activation,with_scale", CASES, ids=lambda v: str(v))
def test_linear_of_no_tokens(rng, fmt, activation, with_scale):
    k, n = 512, 72
    some = torch.from_numpy(rng.standard_normal((4, k)).astype(np.float32)).to(torch.bfloat16)
    lin = bc.prepare_linear(
        make_weight(rng, fmt, n, k, with_scale, some), device="cpu", max_tokens=4, activation=activation
    )
    for shape in [(0, k), (2, 0, k)]:
        y = bc.linear(torch.empty(shape, dtype=torch.bfloat16), lin)
        assert y.shape == shape[:-1] + (n,) and y.dtype == torch.bfloat16
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)
    assert bc.linear(torch.empty(0, k, dtype=torch.bfloat16), lin, bias).shape == (0, n)


@pytest.mark.parametrize("fmt,act_format", MOE_CASES)
def test_moe_of_no_tokens(rng, fmt, act_format):
    e, h, inter, top_k = 4, 256, 256, 2
    scale = 4.0 if act_format == "nvfp4" else None
    w13, w2 = experts(rng, fmt, e, 2 * inter, h, scale), experts(rng, fmt, e, h, inter, scale)
    moe = bc.prepare_moe(w13, w2, top_k=top_k, max_tokens=4, act_format=act_format)
    weights, ids = bc.route_topk(torch.empty(0, e), top_k)
    assert weights.shape == (0, top_k) and ids.shape == (0, top_k)
    y = bc.moe(torch.empty(0, h, dtype=torch.bfloat16), weights, ids, moe)
    assert y.shape == (0, h) and y.dtype == torch.bfloat16


def test_embedding_of_no_ids(rng):
    emb = bc.prepare_embedding(bf.quantize(rng.standard_normal((64, 256)).astype(np.float32), "Q8_0"))
    assert bc.embedding(torch.empty(0, dtype=torch.int64), emb).shape == (0, 256)
