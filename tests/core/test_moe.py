"""Fused MoE reference against a naive per-token float64 loop; routing; TP sharding; errors.

Tolerance (docs/api.md): |y − y64| ≤ 2^-7·|y64| + atol, atol = 1e-3·rms(y64) for bf16 activations and
2e-2·rms(y64) when activations are quantized (the bf16-rounded intermediate may round differently in float64,
moving an element across an fp4/fp8 rounding boundary).
"""

import ml_dtypes
import numpy as np
import pytest
import torch
from act_oracle import quantize as act_oracle

import b12x_core as bc
import b12x_formats as bf

MOE_CASES = [("MXFP4", "bf16"), ("MXFP4", "mxfp8"), ("NVFP4", "bf16"), ("NVFP4", "nvfp4"), ("NVFP4", "mxfp8"),
             ("W4A16_NVFP4", "bf16"), ("IQ2_XS", "bf16"), ("IQ2_XXS", "bf16"), ("Q8_0", "bf16")]  # fmt: skip
MODE = {"bf16": "bf16", "mxfp8": "mxfp8", "nvfp4": "nvfp4"}


def experts(rng, fmt, e, n, k, input_amax=None):
    qw = bf.quantize((rng.standard_normal((e, n, k)) / np.sqrt(k)).astype(np.float32), fmt)
    if input_amax is not None:
        qw = bf.QuantizedWeight.from_tensors(
            fmt, {**qw.tensors, "input_scale": np.full(e, input_amax / 2688, np.float32)}
        )
    return qw


def naive_moe(x, weights, ids, w13, w2, activation, order, mode, s13, s2):
    """float64, one token and one expert at a time -> (y, flips): `flips` bounds what the intermediate's bf16
    rounding can move where the float64 value sits on a rounding midpoint (b12x computes it in float32, batched
    over tokens, so such an element may round to the other neighbour: one bf16 ulp, times its w2 column)."""
    t, h = x.shape
    inter = w2.shape[2]
    xh = act_oracle(x, mode, s13)
    y, flips = np.zeros((t, h)), np.zeros((t, h))
    for i in range(t):
        for slot in range(ids.shape[1]):
            e = ids[i, slot]
            hid = w13[e] @ xh[i]
            if activation == "relu2":
                a = np.maximum(hid, 0) ** 2
            else:
                gate, up = (hid[:inter], hid[inter:]) if order == "gate_up" else (hid[inter:], hid[:inter])
                a = gate / (1 + np.exp(-gate)) * up
            rounded = a.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
            ulp = np.ldexp(1.0, np.frexp(rounded)[1] - 8)  # bf16: 8 significant bits
            on_midpoint = np.abs(np.abs(a - rounded) - ulp / 2) <= 1e-5 * np.abs(a)
            flips[i] += weights[i, slot] * (np.abs(w2[e]) @ np.where(on_midpoint, ulp, 0.0))
            y[i] += weights[i, slot] * (w2[e] @ act_oracle(rounded.astype(np.float32)[None], mode, s2)[0])
    return y, flips


@pytest.mark.parametrize("fmt,act_format", MOE_CASES)
@pytest.mark.parametrize("activation,order", [("silu", "gate_up"), ("silu", "up_gate"), ("relu2", "gate_up")])
def test_against_naive_float64(rng, fmt, act_format, activation, order):
    e, h, inter, top_k, t = 6, 256, 256, 2, 7
    x = torch.from_numpy(rng.standard_normal((t, h)).astype(np.float32)).to(torch.bfloat16)
    amax = float(np.abs(x.float().numpy()).max()) if act_format == "nvfp4" else None
    w13 = experts(rng, fmt, e, 2 * inter if activation == "silu" else inter, h, amax)
    w2 = experts(rng, fmt, e, h, inter, 4.0 if act_format == "nvfp4" else None)
    moe = bc.prepare_moe(
        w13, w2, activation=activation, w13_order=order, max_tokens=16, top_k=top_k, act_format=act_format
    )
    logits = torch.from_numpy(rng.standard_normal((t, e)).astype(np.float32))
    weights, ids = bc.route_topk(logits, top_k, renormalize=True)
    y = bc.moe(x, weights, ids, moe)
    assert y.dtype == torch.bfloat16 and y.shape == (t, h)
    assert torch.equal(bc.moe(x, weights, ids, moe), y)  # deterministic
    s13 = None if "input_scale" not in w13.tensors else float(np.max(w13.tensors["input_scale"]))
    s2 = None if "input_scale" not in w2.tensors else float(np.max(w2.tensors["input_scale"]))
    ref, flips = naive_moe(
        x.float().numpy(), weights.numpy().astype(np.float64), ids.numpy(), bf.dequantize(w13).astype(np.float64),
        bf.dequantize(w2).astype(np.float64), activation, order, MODE[act_format], s13, s2,
    )  # fmt: skip
    rms = np.sqrt(np.mean(ref**2))
    atol = (1e-3 if act_format == "bf16" else 2e-2) * rms
    err = np.abs(y.float().numpy() - ref)
    assert (err <= 2**-7 * np.abs(ref) + atol + flips).all(), (err.max(), rms)


def test_route_topk():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    w, ids = bc.route_topk(logits, 2, renormalize=False)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert ids.tolist() == [[1, 2], [0, 1]]  # ties -> lower expert id
    np.testing.assert_allclose(w.numpy(), torch.softmax(logits, -1).gather(1, ids.long()).numpy(), rtol=1e-6)
    w, ids = bc.route_topk(logits, 3, renormalize=True)
    np.testing.assert_allclose(w.sum(-1).numpy(), 1.0, rtol=1e-6)
    # renormalized = softmax over the selected logits
    np.testing.assert_allclose(w.numpy(), torch.softmax(logits.gather(1, ids.long()), -1).numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="top_k=5 must be in 1..4"):
        bc.route_topk(logits, 5)


@pytest.mark.parametrize("fmt,act_format", [("MXFP4", "mxfp8"), ("IQ2_XS", "bf16"), ("Q8_0", "bf16")])
def test_tensor_parallel_shards_sum_to_unsharded(rng, fmt, act_format):
    e, h, inter, top_k, t = 4, 256, 512, 2, 5
    w13, w2 = experts(rng, fmt, e, 2 * inter, h), experts(rng, fmt, e, h, inter)
    x = torch.from_numpy(rng.standard_normal((t, h)).astype(np.float32)).to(torch.bfloat16)
    weights, ids = bc.route_topk(torch.randn(t, e), top_k)
    full = bc.moe(x, weights, ids, bc.prepare_moe(w13, w2, top_k=top_k, act_format=act_format)).float()
    outs = []
    for rank in range(2):
        w13_r, w2_r = bc.shard_moe_weights(w13, w2, rank, 2)
        assert w13_r.shape == (e, inter, h) and w2_r.shape == (e, h, inter // 2)
        outs.append(bc.moe(x, weights, ids, bc.prepare_moe(w13_r, w2_r, top_k=top_k, act_format=act_format)).float())
    # three bf16 roundings (each rank, the unsharded result): half an ulp = 2^-9 relative each, doubled for
    # float32 reassociation; the sharded halves see exactly the same activation groups
    bound = 2**-8 * (outs[0].abs() + outs[1].abs() + full.abs())
    assert ((outs[0] + outs[1] - full).abs() <= bound).all()


def test_shard_refuses_partial_blocks(rng):
    w13, w2 = experts(rng, "IQ2_XS", 2, 2 * 256, 256), experts(rng, "IQ2_XS", 2, 256, 256)
    with pytest.raises(ValueError, match="cannot cut cols at 128: tensor 'weight' stores 256 cols per entry"):
        bc.shard_moe_weights(w13, w2, 0, 2)
    with pytest.raises(ValueError, match="does not divide into 3 ranks"):
        bc.shard_moe_weights(w13, w2, 0, 3)


def test_errors(rng):
    w13, w2 = experts(rng, "MXFP4", 4, 128, 64), experts(rng, "MXFP4", 4, 64, 64)
    with pytest.raises(bc.UnsupportedError, match="expert parallelism / expert maps are not supported"):
        bc.prepare_moe(w13, w2, top_k=2, expert_map=torch.arange(4))
    fp8 = experts(rng, "FP8", 4, 128, 64)
    with pytest.raises(bc.UnsupportedError, match="w13: FP8 is not a fused-MoE format"):
        bc.prepare_moe(fp8, w2, top_k=2)
    with pytest.raises(bc.UnsupportedError, match=r"MXFP4 MoE runs with act_format \['bf16', 'mxfp8'\], not 'nvfp4'"):
        bc.prepare_moe(w13, w2, top_k=2, act_format="nvfp4")
    nv13, nv2 = experts(rng, "NVFP4", 4, 128, 64), experts(rng, "NVFP4", 4, 64, 64)
    with pytest.raises(bc.UnsupportedError, match="needs the checkpoint's input_scale"):
        bc.prepare_moe(nv13, nv2, top_k=2, act_format="nvfp4")
    with pytest.raises(bc.UnsupportedError, match="does not match w2"):
        bc.prepare_moe(w13, w2, activation="relu2", top_k=2)
    with pytest.raises(bc.UnsupportedError, match="MoE activation 'gelu'"):
        bc.prepare_moe(w13, w2, activation="gelu", top_k=2)
    moe = bc.prepare_moe(w13, w2, top_k=2, max_tokens=3)
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    w, ids = bc.route_topk(torch.randn(4, 4), 2)
    with pytest.raises(bc.UnsupportedError, match="4 tokens, more than max_tokens=3"):
        bc.moe(x, w, ids, moe)
    with pytest.raises(ValueError, match=r"must be \[T, top_k\] = \[2, 2\]"):
        bc.moe(x[:2], w, ids, moe)
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, 4\)"):
        bc.moe(x[:2], w[:2], ids[:2] + 3, moe)


def test_torch_compile_fullgraph(rng):
    w13, w2 = experts(rng, "Q8_0", 4, 128, 64), experts(rng, "Q8_0", 4, 64, 64)
    moe = bc.prepare_moe(w13, w2, top_k=2)
    x, logits = torch.randn(3, 64, dtype=torch.bfloat16), torch.randn(3, 4)

    def f(x, logits):
        w, ids = bc.route_topk(logits, 2)
        return bc.moe(x, w, ids, moe)

    assert torch.equal(torch.compile(f, fullgraph=True, backend="aot_eager")(x, logits), f(x, logits))


def test_w13_as_gate_and_up_shards(rng):
    """Gate and up given as shards with their own per-expert scales run as the stacked w13 would: against the
    naive float64 loop on the two shards' exact weights."""
    e, h, inter = 3, 256, 128
    gate = experts(rng, "NVFP4", e, inter, h)
    up = bf.quantize(rng.standard_normal((e, inter, h)).astype(np.float32) * 5, "NVFP4")  # other scales
    w2 = experts(rng, "NVFP4", e, h, inter)
    moe = bc.prepare_moe([gate, up], w2, top_k=2)
    x = torch.randn(4, h, dtype=torch.bfloat16)
    w, ids = bc.route_topk(torch.randn(4, e), 2)
    y = bc.moe(x, w, ids, moe).float().numpy()
    w13 = np.concatenate([bf.dequantize(gate), bf.dequantize(up)], axis=1).astype(np.float64)
    y64, flips = naive_moe(x.float().numpy(), w.numpy(), ids.numpy(), w13, bf.dequantize(w2).astype(np.float64),
                           "silu", "gate_up", "bf16", None, None)  # fmt: skip
    atol = 1e-3 * np.sqrt(np.mean(y64**2))
    assert (np.abs(y - y64) <= 2**-7 * np.abs(y64) + atol + flips).all()
