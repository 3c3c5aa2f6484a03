"""The fused MoE on SM12x's block-scaled mma.sync (b12x_core.backends.block_scaled_mma_moe; csrc/bsmma_gemm.cu's
grouped form).

On CPU: what it declines, with the reason; SM12x plans choose it for NVFP4 × nvfp4 and MXFP4 × mxfp8 at every token
count and the self-test lists it there; each expert's layout unpacks to that expert's checkpoint bytes, experts a fixed
stride apart; and a whole call (routing, the Triton passes in the interpreter) whose activation pass is its exact CPU
form and whose grouped GEMM is the kernel's loads block by block of the table (bsmma_emulator, each instruction by the
PTX tables' model), against the b12x-core reference, experts without tokens included. On a GPU (marked gpu; the sm_90
build computes the instruction's exact model): the kernels against the reference for both pairs × SiLU (both w13
orders) and ReLU², T ∈ {1, 7, 64, 300} and 4096 with small E / H / I, most experts idle, scratch poisoned first,
repeats bit-identical, CUDA-graph replay with new routing.

    compute-sanitizer --tool memcheck python -m pytest -q -m gpu tests/kernels/test_bsmma_moe.py

in one process, as README's `nox -s gpu` row says (xdist's workers stall under the sanitizer).
"""

from __future__ import annotations

import dataclasses
import functools
import types

import numpy as np
import pytest
import torch
from bsmma_emulator import gemm as emulated_gemm
from closeness import close

import b12x_core as bc
import b12x_formats as bf
from b12x_core import plan, workspace
from b12x_core.backends import DeviceInfo, MoEShape, Query
from b12x_core.backends.block_scaled_mma_moe import BlockScaledMmaMoE, sorted_rows
from b12x_core.block_scaled import gemm, layout
from b12x_core.selftest import checks
from b12x_core.weights import DeviceWeights, as_shards
from b12x_kernels import block_scaled_mma as bsm
from b12x_kernels import interface

pytest.importorskip("triton")

from moe_against_reference import alone_and_reference, check_against_reference  # noqa: E402
from test_moe_tiles import ACTIVATIONS, bf16_weights, problem, quantizer_flips  # noqa: E402

CASES = [("NVFP4", "nvfp4"), ("MXFP4", "mxfp8")]
CUDA = torch.device("cuda", 0)
SM120 = DeviceInfo(CUDA, (12, 0), sms=170, smem_kb=99)
SM121 = DeviceInfo(CUDA, (12, 1), sms=48, smem_kb=99)
H100 = DeviceInfo(CUDA, (9, 0), sms=132, smem_kb=227, name="NVIDIA H100 80GB HBM3")


def _query(info=SM120, fmt="NVFP4", act="nvfp4", activation="silu", experts=128, hidden=2048, inter=768, top_k=8,
           w2_format=None, max_tokens=4096) -> Query:  # fmt: skip
    moe = MoEShape(experts=experts, hidden=hidden, intermediate=inter, top_k=top_k, activation=activation,
                   w13_order="gate_up", act_mode_2=act, w2_format=w2_format or fmt)  # fmt: skip
    rows = 2 * inter if activation == "silu" else inter
    return Query("moe", fmt, act, act, info, n=rows, k=hidden, max_tokens=max_tokens, moe=moe)


# ---------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize(
    "query,why",
    [
        (_query(act="mxfp8"), "not NVFP4 × mxfp8"),
        (_query(fmt="MXFP4", act="bf16"), "not MXFP4 × bf16"),
        (_query(w2_format="MXFP4"), "not MXFP4 × nvfp4"),
        (_query(H100), "compute capability 12.x"),
        (_query(DeviceInfo(torch.device("cpu"), None, kernels="needs a CUDA device")), "needs a CUDA device"),
        (_query(dataclasses.replace(SM120, triton="no Triton here")), "no Triton here"),
    ],
    ids=["nvfp4_mxfp8", "bf16", "w2_format", "hopper", "cpu", "no_triton"],
)
def test_declines_with_the_reason(query, why):
    ok, reason = BlockScaledMmaMoE.can_implement(query)
    assert not ok and why in reason, reason


@pytest.mark.parametrize("info", [SM120, SM121])
@pytest.mark.parametrize("fmt,act", CASES)
@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_sm12x_plans_choose_it_at_every_token_count(info, fmt, act, activation):
    query = _query(info, fmt, act, activation)
    rows = plan.preview(query).rows
    assert {r.backend for r in rows} == {BlockScaledMmaMoE}
    assert rows[0].lo == 1 and rows[-1].hi == query.max_tokens
    # 8-row blocks while the mean slots per expert are at most 8 (T · 8 ≤ 8 · 128), then 32
    assert all(r.config == {"tokens": 8 if r.hi <= 128 else 32} for r in rows)


def test_other_moe_pairs_keep_their_backends_on_sm12x():
    for fmt, act in [("NVFP4", "mxfp8"), ("NVFP4", "bf16"), ("MXFP4", "bf16")]:
        assert BlockScaledMmaMoE not in {r.backend for r in plan.preview(_query(SM120, fmt, act)).rows}


def test_the_selftest_checks_it_on_sm12x():
    names = {c.name for c in checks.checks(SM120)}
    for fmt, act in CASES:
        assert f"moe block_scaled_mma_moe {fmt} × {act}" in names, sorted(n for n in names if "moe" in n)
    (h100,) = [c for c in checks.checks(H100) if c.backend == "block_scaled_mma_moe"]
    assert h100.skip


@pytest.mark.parametrize("fmt,act", CASES)
def test_each_experts_layout_is_its_checkpoint_bytes(rng, fmt, act):
    e, n, k = 3, 40, 160  # N and K off whole tiles and units: each expert padded alike
    qw = bf.quantize(rng.standard_normal((e, n, k)).astype(np.float32), fmt)
    packed = layout.pack_experts([qw], act)
    assert len({w.codes.size for w in packed}) == 1 and len({w.scales.size for w in packed}) == 1
    for x, w in enumerate(packed):
        back = layout.unpack(w)
        assert np.array_equal(back["weight"], np.asarray(qw.tensors["weight"][x]).view(np.uint8).reshape(n, -1))
        assert np.array_equal(back["weight_scale"], np.asarray(qw.tensors["weight_scale"][x]).view(np.uint8))
    shard = gemm.upload(packed, np.ones(e * n, np.float32), 0.0, "cpu")
    assert shard.experts == e and shard.codes.numel() == e * packed[0].codes.size
    # the grouped argument block: experts a layout apart, float32 out, no row factors; the linear's: none of those
    grouped = interface.BsmmaArgs.from_buffer_copy(shard.args(4, n, grouped=True, out_f32=True, row_scale=False))
    assert (grouped.expert_codes, grouped.expert_scales) == (packed[0].codes.size, packed[0].scales.size)
    assert grouped.out_f32 == 1 and grouped.row_scale == 0 and grouped.mt == 4 and grouped.N == n
    assert grouped.kind == bsm.kind_id(layout.instruction(layout.instruction_of(fmt, act)))
    linear = interface.BsmmaArgs.from_buffer_copy(shard.args(1, n))
    assert (linear.expert_codes, linear.expert_scales, linear.out_f32) == (0, 0, 0) and linear.row_scale != 0


@pytest.mark.parametrize("t,top_k,experts,rows", [(1, 1, 8, 8), (1, 4, 32, 8), (7, 2, 8, 8), (300, 8, 32, 32)])
def test_sorted_rows_and_the_table_agree(rng, t, top_k, experts, rows):
    """Rows sorted by expert (each expert's slots in slot order), position inverts order, each row's expert; every
    table block with work lies inside its expert's rows, and the blocks cover every row once; also when the ids sit
    on two experts only."""
    for ids in (rng.integers(0, experts, (t, top_k)), rng.choice([0, experts - 1], (t, top_k))):
        ids = torch.from_numpy(ids).to(torch.int32)
        order, row_expert, position, table = sorted_rows(ids, experts, rows)
        flat = ids.reshape(-1).to(torch.int64)
        assert torch.equal(order, torch.argsort(flat, stable=True))
        assert torch.equal(position[order], torch.arange(t * top_k))
        assert torch.equal(row_expert.to(torch.int64), flat[order]) and row_expert.dtype == torch.int32
        covered = torch.zeros(t * top_k, dtype=torch.int64)
        for e, start, count in table.T.tolist():
            if e >= 0:
                assert 1 <= count <= rows and (row_expert[start : start + count] == e).all()
                covered[start : start + count] += 1
        assert (covered == 1).all()


def _models(monkeypatch, modes: dict, calls: list):
    """gemm.quantize as its CPU form, gemm.grouped as the kernel's loads block by block (bsmma_emulator): each table
    block of an expert's sorted rows against that expert's layout, float32 out, no row factors; rows of no block
    are left as they are (poisoned)."""

    def quantize(x2, shard, buffers, stream):
        mode, scale = modes[id(shard)]
        codes, scales = layout.quantize_x(x2, mode, scale)
        buffers[0].copy_(codes.reshape(-1))
        buffers[1].copy_(scales.reshape(-1))

    def grouped(shard, buffers, table, y, mt, stream):
        assert table.dtype == torch.int32 and table.shape[0] == 3 and y.dtype == torch.float32
        per_codes, per_scales = shard.codes.numel() // shard.experts, shard.scales.numel() // shard.experts
        rows = y.shape[0]
        xq = buffers[0].reshape(rows, -1).numpy()
        xs = buffers[1].reshape(rows, -1).numpy()
        for e, start, count in table.T.tolist():
            if e < 0:
                continue
            assert 1 <= count <= 8 * mt
            w = layout.BsmmaWeight(shard.instruction, shard.n, shard.k, shard.units,
                                   shard.codes[e * per_codes : (e + 1) * per_codes].numpy(),
                                   shard.scales[e * per_scales : (e + 1) * per_scales].numpy())  # fmt: skip
            part = slice(start, start + count)
            y[part] = torch.from_numpy(emulated_gemm(w, xq[part], xs[part], count, mt))
        calls.append(int((table[0] >= 0).sum()))

    monkeypatch.setattr(gemm, "quantize", quantize)
    monkeypatch.setattr(gemm, "grouped", grouped)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # poisoned scratch the passes overwrite
@pytest.mark.parametrize("fmt,act", CASES)
@pytest.mark.parametrize("activation,order", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("t", [1, 7, 40])
def test_a_call_with_the_kernels_loads_matches_the_reference(rng, monkeypatch, fmt, act, activation, order, t):
    """The backend's whole call on the CPU (Triton in its interpreter) with the kernel's activation pass and grouped
    GEMM as their exact models: the reference's output within the GPU tolerance. 8 experts, top-2: at T = 1 six
    experts have no rows; at T = 40, 32-row blocks."""
    if torch.cuda.is_available():
        pytest.skip("the GPU tests run the kernels")
    x, w13, w2, weights, ids = problem(rng, fmt, act, activation, e=8, h=256, inter=160, t=t, top_k=2)
    p = bc.prepare_moe(w13, w2, activation=activation, w13_order=order, max_tokens=t, top_k=2, act_format=act)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: types.SimpleNamespace(cuda_stream=0))
    device_weights = (DeviceWeights(as_shards(w13), p.act_mode_13, p.input_scale_13, p.device),
                      DeviceWeights([w2], p.act_mode_2, p.input_scale_2, p.device))  # fmt: skip
    query = dataclasses.replace(p.plan.query, device=dataclasses.replace(SM120, device=torch.device("cpu")))
    backend = BlockScaledMmaMoE(query, device_weights)
    calls = []
    _models(monkeypatch, {id(backend.w13): (p.act_mode_13, p.input_scale_13),
                          id(backend.w2): (p.act_mode_2, p.input_scale_2)}, calls)  # fmt: skip
    (_, _, config), *_ = BlockScaledMmaMoE.configs(query, t, t)
    assert config == {"tokens": 8 if t * 2 <= 64 else 32}
    workspace.reserve_scratch(p.device, backend.scratch_bytes(t, config))
    workspace.poison(p.device)
    y = backend.run(x, weights, ids, config=config)
    assert len(calls) == 2 and calls[0] == calls[1] >= 1
    ref = bf16_weights(p)
    close(y, ref(x, weights, ids), slack=quantizer_flips(x, weights, ids, ref))


# ---------------------------------------------------------------------------------------------- GPU


_gpu_plan = functools.partial(alone_and_reference, backend=BlockScaledMmaMoE)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act", CASES, ids=str)
@pytest.mark.parametrize("activation,order", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("t", [1, 7, 64, 300])
def test_gpu_bsmma_moe_matches_reference(rng, fmt, act, activation, order, t):
    experts = 32 if t >= 300 else 8  # 8 experts top-2 at T = 1: six without tokens
    mine, ref, inputs = _gpu_plan(rng, fmt, act, activation, order, t, experts=experts)
    check_against_reference(mine, ref, *inputs)


@pytest.mark.gpu
@pytest.mark.fast
@pytest.mark.parametrize("fmt,act", CASES, ids=str)
def test_gpu_bsmma_moe_fast(rng, fmt, act):
    mine, ref, inputs = _gpu_plan(rng, fmt, act, "silu", "gate_up", 7)
    check_against_reference(mine, ref, *inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act", CASES, ids=str)
def test_gpu_bsmma_moe_at_4096_tokens(rng, fmt, act):
    mine, ref, inputs = _gpu_plan(rng, fmt, act, "silu", "gate_up", 4096, experts=4, hidden=256, inter=128)
    check_against_reference(mine, ref, *inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act", CASES, ids=str)
def test_gpu_bsmma_moe_with_most_experts_idle(rng, fmt, act):
    """300 tokens routed to two of 16 experts only: 14 experts without rows, two of 300 rows each (ten 32-row blocks,
    the last partial)."""
    ids = torch.from_numpy(rng.choice([3, 12], (300, 2))).to(torch.int32)
    ids[:, 1] = 15 - ids[:, 0]  # a token's two slots on different experts
    mine, ref, (x, weights, ids) = _gpu_plan(rng, fmt, act, "silu", "gate_up", 300, experts=16, ids=ids)
    check_against_reference(mine, ref, x, weights, ids)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act", CASES, ids=str)
def test_gpu_bsmma_moe_replays_in_cuda_graphs_with_new_routing(rng, fmt, act):
    from graphs import check_moe_replays_with_new_routing

    mine, _, (x, weights, ids) = _gpu_plan(rng, fmt, act, "silu", "gate_up", 64)
    check_moe_replays_with_new_routing(mine.for_tokens(64).run, x.cuda(), weights.cuda(), ids.cuda(), experts=8)
