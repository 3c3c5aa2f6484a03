"""The block-scaled GEMM's operands and plan on a CPU: the repack is lossless; the activation pass's CPU form gives
the activation mode's x̂ exactly; the kernel's loads from the repacked weight and the pass's bytes (bsmma_emulator,
each instruction by the PTX tables' model) compute x̂ · Wᵀ against a float64 oracle of decoded operands; SM12x plans
choose the backend for its pairs at every M and nothing else does; the first-use probe withdraws it on a wrong scale
with one warning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from bsmma_emulator import gemm as emulated_gemm

import b12x_formats as bf
from b12x_core import activations, plan
from b12x_core.backends import DeviceInfo, Query
from b12x_core.backends.block_scaled_mma import BlockScaledMma
from b12x_core.block_scaled import layout, probe
from b12x_core.errors import BackendWithdrawn
from b12x_core.selftest import checks

PAIRS = [("NVFP4", "nvfp4"), ("MXFP8", "mxfp8"), ("MXFP4", "mxfp8")]
CUDA = torch.device("cuda", 0)
SM120 = DeviceInfo(CUDA, (12, 0), sms=170, smem_kb=99)
SM121 = DeviceInfo(CUDA, (12, 1), sms=48, smem_kb=99)
H100 = DeviceInfo(CUDA, (9, 0), sms=132, smem_kb=227, name="NVIDIA H100 80GB HBM3")


def _weight(fmt: str, n: int, k: int, rng) -> bf.QuantizedWeight:
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2.0)).astype(np.float32)
    return bf.quantize(w, fmt)


def _input_scale(x: torch.Tensor) -> float:
    return float(x.abs().max()) / (6 * 448) * 4  # the calibrated amax / (6·448), with room


@pytest.mark.parametrize("name", ["NVFP4", "MXF8", "MXF4_MXF8"])
def test_repack_is_lossless(name):
    rng = np.random.default_rng()
    instr = layout.instruction(name)
    n, k = int(rng.integers(1, 60)), 32 * int(rng.integers(1, 13))
    codes = rng.integers(0, 256, (n, k * instr.atype.bits // 8), dtype=np.uint8)
    scales = rng.integers(0, 256, (n, k // instr.block), dtype=np.uint8)
    w = layout.pack_rows(name, codes, scales, k)
    back = layout.unpack(w)
    assert np.array_equal(back["weight"], codes) and np.array_equal(back["weight_scale"], scales)
    tiles = -(-n // 16)
    assert w.codes.size == tiles * w.units * 32 * layout.steps(name) * (8 if layout.packed_a(name) else 16)
    assert w.scales.size == tiles * w.units * 16 * layout.scale_bytes(name)


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8"])
def test_activation_pass_gives_the_modes_values(mode):
    rng = np.random.default_rng()
    m, k = int(rng.integers(1, 9)), 16 * int(rng.integers(1, 30))
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32) * 10 ** rng.uniform(-3, 3)).bfloat16()
    x[0, : min(k, 32)] = 0  # an all-zero block: the zero scale / smallest E8M0
    scale = _input_scale(x.float()) if mode == "nvfp4" else None
    codes, scales = layout.quantize_x(x, mode, scale)
    units = layout.units_of(k)
    assert codes.shape == (m, units * (64 if mode == "nvfp4" else 128))
    assert scales.shape == (m, units * (8 if mode == "nvfp4" else 4))
    got = layout.decode_x(codes, scales, mode, k)
    want = activations.nvfp4_values(x, scale) if mode == "nvfp4" else activations.quantize_activation(x, mode)
    assert torch.equal(got, want.double())


@pytest.mark.parametrize("fmt,mode", PAIRS)
@pytest.mark.parametrize("m,mt", [(1, 1), (7, 1), (20, 4), (33, 4)])
def test_the_kernels_loads_compute_the_product(fmt, mode, m, mt):
    """The emulated kernel (its addressing of the repacked weight and the pass's bytes, the model's arithmetic)
    against float64 x̂ · Wᵀ: a wrong lane, register, byte or scale slot would move whole blocks."""
    rng = np.random.default_rng()
    n, k = int(rng.integers(1, 40)), 32 * int(rng.integers(1, 11))  # K tails inside a unit; row tails in a tile
    qw = _weight(fmt, n, k, rng)
    w = layout.pack([qw], mode)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).bfloat16()
    scale = _input_scale(x.float()) if mode == "nvfp4" else None
    xq, xs = layout.quantize_x(x, mode, scale)
    got = torch.from_numpy(emulated_gemm(w, xq.numpy(), xs.numpy(), m, mt)).double()
    xh = layout.decode_x(xq, xs, mode, k)
    wd = layout.decode_weight(w)
    want = xh @ wd.T
    # fp32 accumulation, block by block: within K·2^-24 of the sum of magnitudes
    bound = k * 2.0**-24 * (xh.abs() @ wd.abs().T) + 1e-30
    assert ((got - want).abs() <= bound).all(), ((got - want).abs() / bound).max()
    # the decoded weight times the per-tensor factor is the checkpoint's dequantization
    factor = float(np.asarray(qw.tensors.get("weight_scale_2", 1.0)).reshape(-1)[0])
    assert torch.equal((wd * factor).float(), torch.from_numpy(bf.dequantize(qw)))


def _query(fmt, mode, info, m=4096, shards=(4096,), k=4096):
    return Query("linear", fmt, mode, mode, info, "auto", sum(shards), k, m, shards)


@pytest.mark.parametrize("info", [SM120, SM121])
@pytest.mark.parametrize("fmt,mode", PAIRS)
def test_sm12x_plans_choose_it_at_every_token_count(fmt, mode, info):
    rows = plan.preview(_query(fmt, mode, info, shards=(4096, 1024, 1024))).rows
    assert {r.backend for r in rows} == {BlockScaledMma}
    assert rows[0].lo == 1 and rows[-1].hi == 4096
    assert all(r.config == {"tokens": 8 if r.hi <= 8 else 32} for r in rows)


@pytest.mark.parametrize("fmt,mode", PAIRS)
def test_it_declines_off_sm12x_and_for_other_pairs(fmt, mode):
    ok, why = BlockScaledMma.can_implement(_query(fmt, mode, H100))
    assert not ok and "12.x" in why
    for other_fmt, other_mode in [("NVFP4", "mxfp8"), ("NVFP4", "bf16"), ("FP8", "fp8_group128"), ("MXFP4", "bf16")]:
        ok, why = BlockScaledMma.can_implement(_query(other_fmt, other_mode, SM120))
        assert not ok and f"not {other_fmt} × {other_mode}" in why
    cpu = DeviceInfo(torch.device("cpu"), None, kernels="needs a CUDA device")
    assert not BlockScaledMma.can_implement(_query(fmt, mode, cpu))[0]
    tied = Query("linear", fmt, mode, mode, SM120, "auto", 256, 512, 8, (256,), shares_bytes=True)
    assert not BlockScaledMma.can_implement(tied)[0]


def test_the_selftest_checks_it_on_sm12x():
    names = {c.name for c in checks.checks(SM120)}
    for fmt, mode in PAIRS:
        assert f"linear block_scaled_mma {fmt} × {mode}" in names
    (h100,) = [c for c in checks.checks(H100) if c.backend == "block_scaled_mma"]
    assert h100.skip


def _emulated_run(w, x, act_mode, input_scale, mt, device):
    xq, xs = layout.quantize_x(x, act_mode, input_scale)
    return torch.from_numpy(emulated_gemm(w, xq.numpy(), xs.numpy(), x.shape[0], mt))


@pytest.fixture
def fresh_probe(monkeypatch):
    probe.reset()
    monkeypatch.setattr(probe, "run_tile", _emulated_run)
    yield
    probe.reset()


@pytest.mark.parametrize("name", ["NVFP4", "MXF8", "MXF4_MXF8"])
def test_the_probe_agrees_on_a_right_kernel(fresh_probe, name):
    assert probe.check(name, CUDA) == ""


@pytest.mark.parametrize("fmt,mode", PAIRS)
def test_a_wrong_scale_withdraws_it_with_one_warning(fresh_probe, monkeypatch, fmt, mode):
    def corrupt(w):  # one scale byte of row 3's first unit: its value times 2 (E8M0 +1, E4M3 +8)
        instr = layout.instruction(w.instruction)
        w.scales[(2 * 3 + 0) * layout.scale_bytes(w.instruction)] += 1 if instr.stype.man_bits == 0 else 8

    monkeypatch.setattr(probe, "corrupt", corrupt)
    q = _query(fmt, mode, SM120)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(BackendWithdrawn):
            BlockScaledMma.prepare(q, weights=None)
        with pytest.raises(BackendWithdrawn):  # the verdict is kept: no second probe, no second warning
            BlockScaledMma.prepare(q, weights=None)
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and "b12x-selftest" in said[0]
    ok, why = BlockScaledMma.can_implement(q)
    assert not ok and "probe" in why
    _, never, decisions = plan.choose(q)  # the plan falls back
    assert BlockScaledMma not in {d.backend for d in decisions} and "block_scaled_mma" in dict(never)


def test_the_probe_runs_only_on_sm12x_unless_forced(fresh_probe, monkeypatch):
    def fail(*args):
        raise AssertionError("the probe ran")

    monkeypatch.setattr(probe, "check", fail)
    probe.first_use(_query("NVFP4", "nvfp4", H100), "NVFP4")
    monkeypatch.setattr(probe, "force", True)
    with pytest.raises(AssertionError, match="the probe ran"):
        probe.first_use(_query("NVFP4", "nvfp4", H100), "NVFP4")
