"""FP8 × fp8 (fp8_static, fp8_token) in the block-scaled GEMM family (csrc/bsmma_gemm.cu, BSMMA_KIND_FP8: the plain
E4M3 mma.sync m16n8k32, native in both builds).

On CPU: the repack of e4m3 codes is lossless; the kernel's loads (bsmma_emulator: MXF8's model with unit scales, the
same fragments) from the repacked weight and the fp8 pass's codes compute codes · codesᵀ against a float64 oracle;
SM12x plans choose it for both modes at every M and it declines K off whole units; the self-test lists it. On a GPU
(marked gpu): the whole linear against the float64 oracle of x̂ (b12x_core.activations) and the dequantized weight,
fused shards of different weight_scales, tokens 1, 7, 64, 300 and 4096, bias on and off, the output poisoned first,
CUDA-graph replay and bit-identical repeats.

    compute-sanitizer --tool memcheck python -m pytest -q -m gpu tests/kernels/test_bsmma_fp8.py

in one process, as README's `nox -s gpu` row says (xdist's workers stall under the sanitizer).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bsmma_emulator import gemm as emulated_gemm
from poisoned_output import check_its_columns_written, poisoned_output

import b12x_formats as bf
from b12x_core import activations, plan
from b12x_core.backends import DeviceInfo, Query
from b12x_core.backends.block_scaled_mma import BlockScaledMma
from b12x_core.block_scaled import gemm, layout
from b12x_core.selftest import checks
from b12x_core.weights import DeviceWeights
from b12x_kernels import block_scaled_mma as bsm
from b12x_kernels import interface

MODES = ["fp8_static", "fp8_token"]
CUDA = torch.device("cuda", 0)
SM120 = DeviceInfo(CUDA, (12, 0), sms=170, smem_kb=99)
SM121 = DeviceInfo(CUDA, (12, 1), sms=48, smem_kb=99)
H100 = DeviceInfo(CUDA, (9, 0), sms=132, smem_kb=227, name="NVIDIA H100 80GB HBM3")


def _query(mode, info, m=4096, shards=(4096,), k=4096):
    return Query("linear", "FP8", "fp8", mode, info, "auto", sum(shards), k, m, shards)


def _codes(rng, n, k) -> np.ndarray:
    """Random e4m3 codes without NaN (0x7F / 0xFF)."""
    codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0
    return codes


# ---------------------------------------------------------------------------------------------- CPU


def test_fp8_repack_is_lossless(rng):
    n, k = int(rng.integers(1, 60)), 128 * int(rng.integers(1, 5))
    codes = _codes(rng, n, k)
    w = layout.pack_rows(layout.FP8, codes, None, k)
    assert np.array_equal(layout.unpack(w)["weight"], codes)
    assert w.scales.size == 0 and w.codes.size == -(-n // 16) * 16 * w.units * 128
    shard = gemm.upload(w, np.ones(n, np.float32), 0.0, "cpu")
    args = interface.BsmmaArgs.from_buffer_copy(shard.args(4, n))
    assert args.kind == interface.BSMMA_KIND_FP8 and args.scales == 0 and args.K == k and args.units * 128 == k


@pytest.mark.parametrize("m,mt", [(1, 1), (8, 1), (9, 4), (40, 4)])
def test_the_kernels_loads_compute_the_product(rng, m, mt):
    n, k = 40, 256
    codes = _codes(rng, n, k)
    w = layout.pack_rows(layout.FP8, codes, None, k)
    x = _codes(rng, m, k)
    acc = emulated_gemm(w, x, np.zeros((m, 0), np.uint8), m, mt).astype(np.float64)
    xv, wv = bsm.decode(bsm.E4M3, x), bsm.decode(bsm.E4M3, codes)
    want = xv @ wv.T
    bound = 2.0**-22 * (np.abs(xv) @ np.abs(wv).T)  # fp32 sums over K = 256
    assert (np.abs(acc - want) <= bound).all()
    assert torch.equal(layout.decode_weight(w), torch.from_numpy(wv))


@pytest.mark.parametrize("info", [SM120, SM121])
@pytest.mark.parametrize("mode", MODES)
def test_sm12x_plans_choose_it_at_every_token_count(mode, info):
    rows = plan.preview(_query(mode, info, shards=(4096, 1024, 1024))).rows
    assert {r.backend for r in rows} == {BlockScaledMma}
    assert rows[0].lo == 1 and rows[-1].hi == 4096


@pytest.mark.parametrize("mode", MODES)
def test_it_declines_k_off_whole_units_off_sm12x_and_without_triton(mode):
    ok, why = BlockScaledMma.can_implement(_query(mode, SM120, k=4096 + 64))
    assert not ok and "K % 128 == 0" in why
    ok, why = BlockScaledMma.can_implement(_query(mode, H100))
    assert not ok and "12.x" in why
    import dataclasses

    ok, why = BlockScaledMma.can_implement(_query(mode, dataclasses.replace(SM120, triton="no Triton here")))
    assert not ok and "no Triton here" in why
    ok, why = BlockScaledMma.can_implement(_query("fp8_group128", SM120))
    assert not ok and "not FP8 × fp8_group128" in why


def test_the_selftest_checks_it_on_sm12x():
    fp8 = [c for c in checks.checks(SM120) if c.backend == "block_scaled_mma" and c.name.split()[2] == "FP8"]
    assert {c.scaled for c in fp8} == {True, False}, fp8  # fp8_static (an input_scale) and fp8_token


# ---------------------------------------------------------------------------------------------- GPU


def _shards(rows, k, rng):
    """Row shards of different magnitudes: different per-tensor weight_scales."""
    return [bf.quantize((rng.standard_normal((r, k)) * 10 ** rng.uniform(-2, 1)).astype(np.float32), "FP8")
            for r in rows]  # fmt: skip


def _input_scale(mode):
    return float(np.float32(4.0 / 448)) if mode == "fp8_static" else None  # x ~ N(0, 1): |x| ≤ 4 mostly, saturating


def _oracle(x, shards, mode, scale, bias):
    xh = activations.quantize_activation(x.float().cpu(), mode, scale).double()
    w = torch.cat([torch.from_numpy(bf.dequantize(p)).double() for p in shards])
    y = xh @ w.T
    bound = 2.0**-16 * (xh.abs() @ w.abs().T)  # fp32 accumulation on the tensor cores, the factors' roundings
    return (y if bias is None else y + bias.double().cpu()), bound


def _plan(mode, shards, scale, max_tokens):
    n, k = sum(p.shape[0] for p in shards), shards[0].shape[1]
    q = Query("linear", "FP8", "fp8", mode, DeviceInfo.of(CUDA), "auto", n, k, max_tokens,
              tuple(p.shape[0] for p in shards))  # fmt: skip
    return plan.build(q, DeviceWeights(shards, mode, scale, CUDA), only=BlockScaledMma)


def _close(y, want, bound):
    y = y.double().cpu()
    assert not torch.isnan(y).any()
    assert ((y - want).abs() <= bound + 2.0**-8 * want.abs() + 1e-30).all(), ((y - want).abs() - bound).max()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,n,k", [(1, 200, 512), (7, 200, 512), (64, 200, 1024), (300, 136, 512), (4096, 48, 256)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gpu_fp8_linear_matches_the_oracle(rng, mode, m, n, k, with_bias):
    rows = (n - 72, 40, 32) if n > 100 else (n,)  # fused shards; a tile straddles the first boundary
    scale = _input_scale(mode)
    shards = _shards(rows, k, rng)
    p = _plan(mode, shards, scale, m)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(CUDA, torch.bfloat16)
    bias = torch.randn(n, device=CUDA).to(torch.bfloat16) if with_bias else None
    y = p.for_tokens(m).run(x, bias)
    want, bound = _oracle(x, shards, mode, scale, bias)
    _close(y, want, bound)
    assert torch.equal(y, p.for_tokens(m).run(x, bias))  # bit-identical repeats


@pytest.mark.gpu
@pytest.mark.fast
@pytest.mark.parametrize("mode", MODES)
def test_gpu_fp8_linear_fast(rng, mode):
    scale = _input_scale(mode)
    shards = _shards((64, 32), 256, rng)
    p = _plan(mode, shards, scale, 7)
    x = torch.from_numpy(rng.standard_normal((7, 256)).astype(np.float32)).to(CUDA, torch.bfloat16)
    want, bound = _oracle(x, shards, mode, scale, None)
    _close(p.for_tokens(7).run(x, None), want, bound)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_gpu_fp8_every_output_is_written(rng, mode):
    from b12x_core import workspace

    m, n, k = 9, 56, 384
    scale = _input_scale(mode)
    shards = _shards((n,), k, rng)
    static = float(np.float32(scale)) if scale else 0.0
    shard = gemm.prepare(shards, mode, np.ones(n, np.float32), static, CUDA)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(CUDA, torch.bfloat16)
    workspace.reserve_scratch(CUDA, workspace.nbytes(layout.x_specs(layout.FP8, m, k)))
    workspace.poison(CUDA)
    buffers = workspace.carve(CUDA, layout.x_specs(layout.FP8, m, k))
    y = poisoned_output(m, n, CUDA)
    gemm.run(x, shard, y, None, 4, buffers, torch.cuda.current_stream().cuda_stream, mode, static)
    torch.cuda.synchronize()
    check_its_columns_written(y, n)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_gpu_fp8_graph_replay(rng, mode):
    from graphs import check_linear_replays_with_new_activations

    k, rows, m = 512, (64, 64), 40
    scale = _input_scale(mode)
    p = _plan(mode, _shards(rows, k, rng), scale, m)
    x = torch.randn(m, k, device=CUDA).to(torch.bfloat16)
    check_linear_replays_with_new_activations(p.for_tokens(m).run, x)
