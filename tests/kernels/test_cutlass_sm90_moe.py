"""The fused MoE on the grouped Hopper CUTLASS GEMM (b12x_core.backends.cutlass_sm90_moe; csrc/sm90_moe_gemm.cuh).

On CPU: what it declines, with the reason; the expert carriers of the block scales against a loop; the sorted routing
(order, each row's expert, each slot's row, the expert offsets) against its definition, experts without tokens
included; a plan never picks it unmeasured, nor where the shipped table holds no time of it, and picks it where a
measured table has it faster (with a second weight copy allowed); and a whole call (the Triton passes in the
interpreter) with its two GEMMs replaced by a model of the kernel's contract, whose weights are decoded by
b12x_formats from the bytes and carriers the backend hands the kernel, against the b12x-core reference. On an sm_90 GPU
(marked gpu): the kernels against the reference for NVFP4 and MXFP4 × every activation format × SiLU (both w13
orders) and ReLU², T ∈ {1, 7, 64, 300, 1024} over 8-32 experts, experts without tokens, scratch poisoned first,
repeats bit-identical, and CUDA graph replay with new routing.
"""

from __future__ import annotations

import dataclasses
import functools
import types

import numpy as np
import pytest
import torch
from closeness import close
from graphs import check_moe_replays_with_new_routing

import b12x_core as bc
import b12x_formats as bf
from b12x_core import backends, plan, timings, workspace
from b12x_core.backends import MoEShape, Query
from b12x_core.backends.cutlass_sm90_moe import CutlassSm90MoE, expert_tile_scales, sorted_routing
from b12x_core.weights import DeviceWeights, as_shards
from b12x_kernels import interface

pytest.importorskip("triton")

from moe_against_reference import alone_and_reference, check_against_reference  # noqa: E402
from test_moe_tiles import ACTIVATIONS, H200, bf16_weights, problem, quantizer_flips  # noqa: E402

CUDA_H200 = dataclasses.replace(H200, device=torch.device("cuda"))
CASES = [(fmt, act) for fmt in interface.SM90_MOE.formats for act in bf.spec(fmt).moe_activations]
TS = [1, 7, 64, 300, 1024]


def _query(device_info=CUDA_H200, fmt="MXFP4", act="bf16", activation="silu", experts=128, hidden=2048, inter=768,
           top_k=8, w2_format=None, max_tokens=4096) -> Query:  # fmt: skip
    moe = MoEShape(experts=experts, hidden=hidden, intermediate=inter, top_k=top_k, activation=activation,
                   w13_order="gate_up", act_mode_2=act, w2_format=w2_format or fmt)  # fmt: skip
    rows = 2 * inter if activation == "silu" else inter
    return Query("moe", fmt, act, act, device_info, n=rows, k=hidden, max_tokens=max_tokens, moe=moe)


# ---------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize(
    "query,why",
    [
        (_query(fmt="Q8_0"), "converts NVFP4, W4A16_NVFP4, MXFP4, not Q8_0"),
        (_query(w2_format="IQ2_XS"), "not IQ2_XS"),
        (_query(inter=96), "I % 64 == 0, is 96"),
        (_query(inter=96, activation="relu2"), "w13 rows per expert % 64 == 0, is 96"),
        (_query(hidden=2016), "H % 64 == 0, is 2016"),
        (_query(dataclasses.replace(CUDA_H200, capability=(12, 0))), "needs compute capability 9.0"),
        (_query(dataclasses.replace(CUDA_H200, sm90_mixed="this build holds none")), "holds none"),
        (_query(H200), "needs a CUDA device"),
    ],
    ids=["format", "w2_format", "inter", "relu2_rows", "hidden", "sm_120", "not_built", "cpu"],
)
def test_declines_with_the_reason(query, why):
    ok, reason = CutlassSm90MoE.can_implement(query)
    assert not ok and why in reason, reason


def test_takes_every_format_and_activation_mode_it_converts():
    for fmt, act in CASES:
        ok, reason = CutlassSm90MoE.can_implement(_query(fmt=fmt, act=act))
        assert ok, (fmt, act, reason)
    assert not CutlassSm90MoE.can_implement(_query(fmt="NVFP4", act="fp8_static"))[0]


@pytest.mark.parametrize("group", [16, 32])
def test_expert_tile_scales_put_each_experts_row_tiles_together(rng, group):
    e, n, k = 3, 128, 320
    block = torch.from_numpy(rng.integers(0, 256, (e * n, k // group), dtype=np.uint8))
    tiled = expert_tile_scales(block, e, k)
    per_tile = 64 // group
    assert tiled.shape == (e, k // 64, n, per_tile) and tiled.is_contiguous()
    for x in range(e):
        for t in range(k // 64):
            for row in range(0, n, 29):
                for i in range(per_tile):
                    assert tiled[x, t, row, i] == block[x * n + row, t * per_tile + i]


@pytest.mark.parametrize("t,top_k,experts", [(1, 1, 8), (1, 4, 32), (7, 2, 8), (300, 8, 32), (64, 3, 5)])
def test_sorted_routing_is_a_stable_sort_by_expert(rng, t, top_k, experts):
    """Rows sorted by expert, each expert's slots in slot order; position inverts order; offsets bound each expert's
    rows (an expert without tokens has an empty range), also when the ids are concentrated on two experts."""
    for ids in (rng.integers(0, experts, (t, top_k)), rng.choice([0, experts - 1], (t, top_k))):
        ids = torch.from_numpy(ids).to(torch.int32)
        order, row_expert, position, offsets = sorted_routing(ids, experts)
        flat = ids.reshape(-1).to(torch.int64)
        assert sorted(order.tolist()) == list(range(t * top_k))
        assert torch.equal(row_expert.to(torch.int64), flat[order]) and row_expert.dtype == torch.int32
        assert torch.equal(position[order], torch.arange(t * top_k))
        assert offsets.dtype == torch.int32 and offsets.shape == (experts + 1,) and offsets[0] == 0
        for e in range(experts):
            rows = order[int(offsets[e]) : int(offsets[e + 1])]
            assert torch.equal(rows, (flat == e).nonzero().reshape(-1))  # ascending slots of expert e
        assert int(offsets[-1]) == t * top_k


def _entry(faster_from: int, fmt="MXFP4") -> timings.Entry:
    """A measured MoE table of the Qwen3-like layer in which the CUTLASS MoE is faster from `faster_from` tokens."""
    ms = (1, 16, 64, 256, 1024, 4096)
    mma = tuple(30.0 * m**0.7 for m in ms)
    mine = tuple(t * (0.8 if m >= faster_from else 1.3) for m, t in zip(ms, mma, strict=True))
    us = {"tensor_core_moe": mma, "triton_moe": tuple(3 * t for t in mma), CutlassSm90MoE.name: mine}
    return timings.Entry((9, 0), fmt, "bf16", timings.shape_class(1536, 2048), ms, us, "test", op="moe")


def test_a_plan_picks_it_only_where_a_measured_table_has_it_faster(monkeypatch):
    """Unmeasured, the tensor-core MoE runs every token count. Measured faster from 256 tokens, it reads another copy of
    the weight than the tensor-core MoE (the checkpoint's), so one copy keeps the tensor-core family (its own family,
    with the Triton MoE at small T, loses more); with two copies allowed it runs the tokens above 64."""
    query = _query()
    _, _, unmeasured = plan.choose(query, entries=[])
    assert [d.backend.name for d in unmeasured] == ["tensor_core_moe"]
    _, _, one_copy = plan.choose(query, entries=[_entry(faster_from=256)])
    assert [d.backend.name for d in one_copy] == ["tensor_core_moe"]
    assert "second copy" in dict(one_copy[0].lost)[CutlassSm90MoE.name]
    monkeypatch.setenv("B12X_WEIGHT_COPIES", "2")
    _, _, two = plan.choose(query, entries=[_entry(faster_from=256)])
    assert [(d.lo, d.backend.name) for d in two] == [(1, "tensor_core_moe"), (65, CutlassSm90MoE.name)]
    _, _, never = plan.choose(query, entries=[_entry(faster_from=10**6)])
    assert [d.backend.name for d in never] == ["tensor_core_moe"]


@pytest.mark.parametrize("fmt,act", CASES)
@pytest.mark.parametrize("shape", [dict(hidden=2048, inter=768, experts=128, top_k=8),
                                   dict(hidden=2880, inter=2880, experts=128, top_k=4)])  # fmt: skip
def test_the_shipped_tables_plans_are_what_they_were_without_it(monkeypatch, fmt, act, shape):
    """Until a table holds its times, registering it changes no plan: the shipped table (timings.json) decides every
    MoE query it can run as it does with the backend left out of the registry."""
    query = _query(CUDA_H200, fmt=fmt, act=act, **shape)
    basis, _, decisions = plan.choose(query)
    monkeypatch.setattr(backends, "REGISTRY", tuple(c for c in backends.REGISTRY if c is not CutlassSm90MoE))
    basis_without, _, without = plan.choose(query)
    assert [(d.lo, d.hi, d.backend.name) for d in decisions] == [(d.lo, d.hi, d.backend.name) for d in without]
    assert basis == basis_without


def _decoded(fmt: str, codes: torch.Tensor, carriers: torch.Tensor, dtypes: dict) -> torch.Tensor:
    """One expert's weight [N, K] from the codes and carriers handed to the kernel, decoded by b12x_formats (the
    per-tensor factors left to the row factors: 1 here)."""
    n, k = codes.shape[0], codes.shape[1] * 2
    block = carriers.permute(1, 0, 2).reshape(n, -1).numpy()  # [K/64, N, per] -> [N, K/group]
    block_name = "weight_scale"
    tensors = {"weight": codes.numpy(), block_name: block.view(dtypes[block_name])}
    if "weight_scale_2" in dtypes:
        tensors["weight_scale_2"] = np.float32(1.0)
    weight = bf.dequantize(bf.QuantizedWeight.from_tensors(fmt, tensors))
    assert weight.shape == (n, k)
    return torch.from_numpy(weight)


def _gemm_model(dtypes: dict, calls: list):
    """CutlassSm90MoE._gemm as csrc/sm90_moe.h defines the kernel: per expert e, rows [offsets[e], offsets[e+1]) of x
    times that expert's weight (its codes at e·N rows of the stack, its carriers), float32 or bf16 out; what it is
    handed is checked against the binding's rules first."""

    def gemm(self, fmt, stacked, scales, n, k, x, y, offsets, gemm_ws, stream):
        experts = self.query.moe.experts
        group = bf.spec(fmt).group_size
        assert scales.shape == (experts, k // 64, n, 64 // group) and scales.dtype == torch.uint8
        assert stacked.weight.view(torch.uint8).shape == (experts * n, k // 2)
        assert x.dtype == torch.bfloat16 and x.shape[1] == k and x.is_contiguous()
        assert y.shape == (x.shape[0], n) and y.is_contiguous() and y.dtype in (torch.float32, torch.bfloat16)
        assert offsets.dtype == torch.int32 and offsets.shape == (experts + 1,) and int(offsets[-1]) == x.shape[0]
        assert gemm_ws.numel() >= 1024
        for t in (stacked.weight, scales, x, y, offsets, gemm_ws):
            assert t.data_ptr() % 16 == 0
        codes = stacked.weight.view(torch.uint8).reshape(experts, n, k // 2)
        for e in range(experts):
            lo, hi = int(offsets[e]), int(offsets[e + 1])
            if hi > lo:
                w = _decoded(fmt, codes[e], scales[e], dtypes)
                y[lo:hi] = (x[lo:hi].float() @ w.T).to(y.dtype)
        calls.append(y.dtype)

    return gemm


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # poisoned scratch the passes overwrite
@pytest.mark.parametrize("fmt,act", CASES)
@pytest.mark.parametrize("activation,order", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("t", [1, 7, 40])
def test_a_call_with_a_model_of_the_gemm_matches_the_reference(rng, monkeypatch, fmt, act, activation, order, t):
    """The backend's whole call on the CPU (routing, operand passes, gather, activation, combine; Triton in its
    interpreter), its two GEMMs the kernel's contract on what it hands them: the reference's output within the GPU
    tolerance. 8 experts, top-2: at T = 1 six experts have no rows."""
    import b12x_kernels

    if torch.cuda.is_available():
        pytest.skip("the GPU tests run the kernels")
    x, w13, w2, weights, ids = problem(rng, fmt, act, activation, e=8, h=256, inter=128, t=t, top_k=2)
    p = bc.prepare_moe(w13, w2, activation=activation, w13_order=order, max_tokens=t, top_k=2, act_format=act)
    dtypes = {name: np.asarray(a).dtype for name, a in w13.tensors.items()}
    calls = []
    monkeypatch.setattr(CutlassSm90MoE, "_gemm", _gemm_model(dtypes, calls))
    monkeypatch.setattr(b12x_kernels, "sm90_moe_workspace_bytes", lambda *args: 4096, raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: types.SimpleNamespace(cuda_stream=0))
    device_weights = (DeviceWeights(as_shards(w13), p.act_mode_13, p.input_scale_13, p.device),
                      DeviceWeights([w2], p.act_mode_2, p.input_scale_2, p.device))  # fmt: skip
    backend = CutlassSm90MoE(p.plan.query, device_weights)
    (_, _, config), *_ = CutlassSm90MoE.configs(p.plan.query, 1, t)
    workspace.reserve_scratch(p.device, backend.scratch_bytes(t, config))
    workspace.poison(p.device)
    y = backend.run(x, weights, ids, config=config)
    assert calls == [torch.float32, torch.float32]  # both unrounded: the combine rounds once
    ref = bf16_weights(p)
    close(y, ref(x, weights, ids), slack=quantizer_flips(x, weights, ids, ref))


# ---------------------------------------------------------------------------------------------- GPU


_gpu_plan = functools.partial(alone_and_reference, backend=CutlassSm90MoE)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act", CASES, ids=str)
@pytest.mark.parametrize("activation,order", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("t", TS)
def test_gpu_cutlass_moe_matches_reference(rng, hopper, fmt, act, activation, order, t):
    experts = 32 if t >= 300 else 8  # 8 experts top-2 at T = 1: six without tokens
    mine, ref, inputs = _gpu_plan(rng, fmt, act, activation, order, t, experts=experts)
    check_against_reference(mine, ref, *inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act", [("MXFP4", "bf16"), ("NVFP4", "nvfp4")], ids=str)
def test_gpu_cutlass_moe_with_most_experts_idle(rng, hopper, fmt, act):
    """300 tokens routed to two of 16 experts only: 14 problems without rows, two of 300 rows (three 128-token tiles,
    the last partial)."""
    ids = torch.from_numpy(rng.choice([3, 12], (300, 2))).to(torch.int32)
    mine, ref, (x, weights, ids) = _gpu_plan(rng, fmt, act, "silu", "gate_up", 300, experts=16, ids=ids)
    check_against_reference(mine, ref, x, weights, ids)


@pytest.mark.gpu
def test_gpu_cutlass_moe_replays_in_cuda_graphs_with_new_routing(rng, hopper):
    mine, _, (x, weights, ids) = _gpu_plan(rng, "NVFP4", "bf16", "silu", "gate_up", 64)
    check_moe_replays_with_new_routing(mine.for_tokens(64).run, x.cuda(), weights.cuda(), ids.cuda(), experts=8)
