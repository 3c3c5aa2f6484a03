"""The block-scaled GEMM (csrc/bsmma_gemm.cu; on the H100 its sm_90 build, the instruction's exact model) as a whole
linear against an independent oracle: the float64 product of the activation mode's x̂ (b12x_core.activations) and the
checkpoint's dequantized weight (b12x_formats), times nvfp4's input_scale, plus bias, within fp32 accumulation and one
bf16 rounding. Fused shards of different per-tensor scales; tokens 1, 7, 64, 300 and 4096; bias on and off; the
output poisoned first; CUDA-graph replay; bit-identical repeats; the activation pass's bytes against its CPU form;
the first-use probe agrees, and withdraws the backend where one scale is corrupted.

    compute-sanitizer --tool memcheck python -m pytest -q -m gpu tests/kernels/test_bsmma_gemm.py

in one process, as README's `nox -s gpu` row says (xdist's workers stall under the sanitizer).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from poisoned_output import check_its_columns_written, poisoned_output

import b12x_formats as bf
from b12x_core import activations, plan
from b12x_core.backends import DeviceInfo, Query
from b12x_core.backends.block_scaled_mma import BlockScaledMma
from b12x_core.block_scaled import gemm, layout, probe
from b12x_core.errors import BackendWithdrawn
from b12x_core.weights import DeviceWeights

pytestmark = pytest.mark.gpu

PAIRS = [("NVFP4", "nvfp4"), ("MXFP8", "mxfp8"), ("MXFP4", "mxfp8")]
DEV = torch.device("cuda", 0)


def _shards(fmt, rows, k, rng):
    """Row shards of different magnitudes (so different per-tensor scales for NVFP4)."""
    return [bf.quantize((rng.standard_normal((r, k)) * 10 ** rng.uniform(-2, 1)).astype(np.float32), fmt) for r in rows]


def _input_scale(fmt):
    """nvfp4's per-tensor input_scale (x ~ N(0, 1): block scales amax / 6 / 0.02 well inside E4M3)."""
    return float(np.float32(0.02)) if fmt == "NVFP4" else None


def _oracle(x, shards, mode, scale, bias):
    """float64: x̂ (the mode's values, input_scale included) · Wᵀ (+ bias)."""
    xh = activations.quantize_activation(x.float().cpu(), mode, scale).double()
    w = torch.cat([torch.from_numpy(bf.dequantize(p)).double() for p in shards])
    y = xh @ w.T
    bound = 2.0**-20 * (xh.abs() @ w.abs().T)  # fp32 accumulation over K ≤ 4096 and the row factor's rounding
    return (y if bias is None else y + bias.double().cpu()), bound


def _plan(fmt, mode, shards, scale, max_tokens):
    n, k = sum(p.shape[0] for p in shards), shards[0].shape[1]
    q = Query(
        "linear", fmt, mode, mode, DeviceInfo.of(DEV), "auto", n, k, max_tokens, tuple(p.shape[0] for p in shards)
    )
    return plan.build(q, DeviceWeights(shards, mode, scale, DEV), only=BlockScaledMma)


def _close(y, want, bound):
    y = y.double().cpu()
    assert not torch.isnan(y).any()
    assert ((y - want).abs() <= bound + 2.0**-8 * want.abs() + 1e-30).all(), ((y - want).abs() - bound).max()


@pytest.mark.parametrize("fmt,mode", PAIRS)
@pytest.mark.parametrize("m,n,k", [(1, 200, 512), (7, 200, 512), (64, 200, 1056), (300, 136, 512), (4096, 48, 256)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_the_oracle(rng, fmt, mode, m, n, k, with_bias):
    rows = (n - 72, 40, 32) if n > 100 else (n,)  # fused shards; a tile straddles the first boundary
    scale = _input_scale(fmt)
    shards = _shards(fmt, rows, k, rng)
    p = _plan(fmt, mode, shards, scale, m)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(DEV, torch.bfloat16)
    bias = torch.randn(n, device=DEV).to(torch.bfloat16) if with_bias else None
    y = p.for_tokens(m).run(x, bias)
    want, bound = _oracle(x, shards, mode, scale, bias)
    _close(y, want, bound)
    assert torch.equal(y, p.for_tokens(m).run(x, bias))  # bit-identical repeats


@pytest.mark.parametrize("fmt,mode", PAIRS)
@pytest.mark.parametrize("m,mt", [(1, 1), (8, 1), (9, 4), (300, 4)])
def test_every_output_is_written_and_the_pass_matches_its_cpu_form(rng, fmt, mode, m, mt):
    k, n = 384, 56
    scale = _input_scale(fmt)
    shards = _shards(fmt, (n,), k, rng)
    name = layout.instruction_of(fmt, mode)
    x_scale = float(np.float32(1) / np.float32(scale)) if scale else 0.0
    shard = gemm.prepare(shards, mode, np.ones(n, np.float32), x_scale, DEV)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(DEV, torch.bfloat16)
    xq, xs = [torch.full(shape, 0xA5, dtype=dtype, device=DEV) for shape, dtype in layout.x_specs(name, m, k)]
    y = poisoned_output(m, n, DEV)
    gemm.run(x, shard, y, None, mt, [xq, xs], torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    cq, cs = layout.quantize_x(x, mode, scale)
    assert torch.equal(xq.cpu().view(m, -1), cq) and torch.equal(xs.cpu().view(m, -1), cs)
    check_its_columns_written(y, n)


@pytest.mark.parametrize("fmt,mode", PAIRS)
def test_graph_replay(rng, fmt, mode):
    from graphs import check_linear_replays_with_new_activations

    k, rows, m = 512, (64, 64), 40
    scale = _input_scale(fmt)
    shards = _shards(fmt, rows, k, rng)
    p = _plan(fmt, mode, shards, scale, m)
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    check_linear_replays_with_new_activations(p.for_tokens(m).run, x)


def _double_a_scale(w):
    """One scale byte of the probe tile (row 3, the first unit) made worth twice its value (E8M0 +1, E4M3 +8)."""
    w.scales[2 * 3 * layout.scale_bytes(w.instruction)] += (
        1 if layout.instruction(w.instruction).stype.man_bits == 0 else 8
    )


@pytest.mark.parametrize("name", ["NVFP4", "MXF8", "MXF4_MXF8"])
def test_the_probe_agrees_and_a_corrupt_scale_withdraws_it(monkeypatch, name):
    probe.reset()
    try:
        assert probe.check(name, DEV) == ""
        fmt, mode = next(pair for pair in PAIRS if layout.instruction_of(*pair) == name)
        monkeypatch.setattr(probe, "force", True)  # this GPU runs the emulated build; the probe runs anyway
        monkeypatch.setattr(probe, "corrupt", _double_a_scale)
        q = Query("linear", fmt, mode, mode, DeviceInfo.of(DEV), "auto", 64, 256, 8, (64,))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(BackendWithdrawn):
                BlockScaledMma.prepare(q, None)
        assert sum("b12x-selftest" in str(w.message) for w in caught) == 1
    finally:
        probe.reset()
