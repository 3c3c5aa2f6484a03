"""The fused MoE on the Hopper grouped GEMM (b12x_core.backends.tensor_core_moe_wgmma; csrc/wgmma_gemm.cu, grouped).

On CPU: what it declines, its configurations (32-128-slot blocks from the table, never the decode-sized forms), that
a plan runs it only where a measured table has it faster and then on the tensor-core MoE's expert stack (one copy),
and that a call's scratch holds both GEMMs' staging. On an sm_90 GPU (marked gpu): against the reference on the
weights the kernels multiply, every format it runs × activation mode × activation, at token counts that take each
block size, with poisoned scratch; deterministic; against the mma.sync MoE; replayed in a CUDA graph with new
routing.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from closeness import close
from graphs import check_moe_replays_with_new_routing

import b12x_core as bc
from b12x_core import plan, timings, workspace
from b12x_core.backends import MoEShape, Query
from b12x_core.backends.tensor_core_moe import TensorCoreMoE, TensorCoreMoEWgmma
from b12x_core.plan import memory
from b12x_core.tensor_core import wgmma
from b12x_core.weights import DeviceWeights, as_shards

pytest.importorskip("triton")

from test_mma_moe import kernel_reference  # noqa: E402
from test_moe_tiles import ACTIVATIONS, H200, alone, prepared_on_cuda, problem, quantizer_flips  # noqa: E402

CUDA_H200 = dataclasses.replace(H200, device=torch.device("cuda"))
CASES = [("NVFP4", "nvfp4"), ("NVFP4", "bf16"), ("W4A16_NVFP4", "bf16"), ("MXFP4", "mxfp8"), ("MXFP4", "bf16"),
         ("Q8_0", "bf16"), ("IQ2_XS", "bf16"), ("IQ2_XXS", "bf16")]  # fmt: skip
LAYERS = [(8, 128, 2048, 768), (4, 128, 2880, 2880), (8, 256, 7168, 2048), (2, 8, 512, 256)]  # top_k, E, H, I


def _query(device_info, max_tokens=4096, fmt="MXFP4", act="bf16", top_k=8, experts=128, hidden=2048, inter=768,
           w2_format=None) -> Query:  # fmt: skip
    moe = MoEShape(experts=experts, hidden=hidden, intermediate=inter, top_k=top_k, activation="silu",
                   w13_order="gate_up", act_mode_2=act, w2_format=w2_format or fmt)  # fmt: skip
    return Query("moe", fmt, act, act, device_info, n=2 * inter, k=hidden, max_tokens=max_tokens, moe=moe)


@pytest.mark.parametrize(
    "query,why",
    [
        (_query(dataclasses.replace(CUDA_H200, capability=(12, 0))), "compute capability 9.0"),
        (_query(H200), "CUDA"),  # the op on the CPU
        (_query(CUDA_H200, inter=12), "% 16"),  # what the tensor-core MoE's stacks cannot hold, it cannot either
    ],
    ids=["sm_120", "cpu", "rows"],
)
def test_declines_what_its_grouped_form_cannot_run(query, why):
    ok, reason = TensorCoreMoEWgmma.can_implement(query)
    assert not ok and why in reason


@pytest.mark.parametrize("fmt,blocks", [("MXFP4", (32, 64, 128)), ("IQ2_XS", (32, 64))])
@pytest.mark.parametrize("top_k,experts,hidden,inter", LAYERS)
def test_configurations_take_the_block_that_holds_an_experts_slots(fmt, blocks, top_k, experts, hidden, inter):
    """Every token count 1-4096 has a row; each takes the smallest block the grouped form runs the format at (32,
    64, 128 slots; IQ2, with its second accumulator set, up to 64) that holds the mean slots per touched expert
    (the largest past it), the table made apart (never the mma.sync kernel's routing in the GEMMs, nor its held
    rows), K whole where the busy tiles fill the SMs."""
    query = _query(CUDA_H200, fmt=fmt, top_k=top_k, experts=experts, hidden=hidden, inter=inter)
    assert TensorCoreMoEWgmma.can_implement(query)[0]
    rows = TensorCoreMoEWgmma.configs(query, 1, 4096)
    assert rows[0][0] == 1 and rows[-1][1] == 4096
    assert all(a[1] + 1 == b[0] for a, b in zip(rows, rows[1:], strict=False))
    for first, last, config in rows:
        assert config["route"] != "gemm" and "held" not in config
        for t in (first, last):
            slots = t * top_k
            per_expert = -(-slots // min(slots, experts))
            assert config["tokens"] == next((b for b in blocks if per_expert <= b), blocks[-1]), (t, config)
    assert rows[-1][2]["splits"] == (1, 1)  # 4096 tokens fill the GPU many times over


def _entry(faster_from: int) -> timings.Entry:
    """A measured MoE table for the Qwen3-like MXFP4 layer in which the wgmma MoE is faster from `faster_from`."""
    ms = (1, 16, 64, 256, 1024, 4096)
    mma = tuple(30.0 * m**0.7 for m in ms)
    wg = tuple(t * (0.8 if m >= faster_from else 1.3) for m, t in zip(ms, mma, strict=True))
    us = {"tensor_core_moe": mma, "triton_moe": tuple(3 * t for t in mma), TensorCoreMoEWgmma.name: wg}
    return timings.Entry((9, 0), "MXFP4", "bf16", timings.shape_class(1536, 2048), ms, us, "test", op="moe")


def test_a_plan_runs_it_only_where_a_measured_table_has_it_faster():
    """Unmeasured, the tensor-core MoE runs every token count; measured faster from 256 tokens, the wgmma MoE runs
    the tokens above the last count where it lost, and both keep one copy of the experts (the same layout)."""
    query = _query(CUDA_H200)
    _, _, unmeasured = plan.choose(query, entries=[])
    assert [d.backend.name for d in unmeasured] == ["tensor_core_moe"]
    assert "default order" in dict(unmeasured[0].lost)[TensorCoreMoEWgmma.name]
    _, _, measured = plan.choose(query, entries=[_entry(faster_from=256)])
    assert [(d.lo, d.backend.name) for d in measured] == [(1, "tensor_core_moe"), (65, TensorCoreMoEWgmma.name)]
    assert not any("second copy" in why for d in measured for _, why in d.lost)
    _, _, never = plan.choose(query, entries=[_entry(faster_from=10**6)])
    assert [d.backend.name for d in never] == ["tensor_core_moe"]


def _cpu_moe(rng, fmt="MXFP4", act="bf16", t=40, inter=192):
    """(a CPU-prepared MoE, its weights as the backends take them, (x, router weights, ids) of t tokens)."""
    x, w13, w2, weights, ids = problem(rng, fmt, act, "silu", e=8, h=512, inter=inter, t=t, top_k=2)
    p = bc.prepare_moe(w13, w2, activation="silu", max_tokens=t, top_k=2, act_format=act)
    device_weights = (DeviceWeights(as_shards(w13), p.act_mode_13, p.input_scale_13, p.device),
                      DeviceWeights([w2], p.act_mode_2, p.input_scale_2, p.device))  # fmt: skip
    return p, device_weights, (x, weights, ids)


def test_both_tensor_core_moe_forms_read_one_expert_stack(rng):
    """Prepared over the same weights, the mma.sync and the wgmma MoE hold the same expert stacks: a plan with both
    holds the experts' bytes once."""
    p, weights, _ = _cpu_moe(rng)
    mma = plan.build(p.plan.query, weights, only=TensorCoreMoE, warm=False)
    wg = plan.build(p.plan.query, weights, only=TensorCoreMoEWgmma, warm=False)
    a, b = mma.rows[0].backend, wg.rows[0].backend
    assert a.w13 is b.w13 and a.w2 is b.w2
    assert memory.held_bytes(mma.rows + wg.rows) == memory.held_bytes(mma.rows) > 0


@pytest.mark.parametrize("t", [1, 40, 200])
def test_a_calls_scratch_holds_both_gemms_staging(rng, t):
    """Over the mma.sync MoE's scratch for the same configuration, a call takes the staging of the larger GEMM:
    every table block's slots × its K, in the MMA's operand order."""
    p, weights, _ = _cpu_moe(rng, t=t)
    wg = plan.build(p.plan.query, weights, only=TensorCoreMoEWgmma, warm=False)
    mma = plan.build(p.plan.query, weights, only=TensorCoreMoE, warm=False)
    row = wg.for_tokens(t)
    shape = p.plan.query.moe
    rows = TensorCoreMoEWgmma.table_blocks(p.plan.query, t, row.config) * row.config["tokens"]
    staged = max(wgmma.staged_bytes(p.w13_format, rows, shape.hidden),
                 wgmma.staged_bytes(p.w2_format, rows, shape.intermediate))  # fmt: skip
    more = row.backend.scratch_bytes(t, row.config) - mma.rows[0].backend.scratch_bytes(t, row.config)
    assert more >= staged


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the quantize pass and combine read what no kernel wrote
@pytest.mark.parametrize(
    "fmt,act", [("MXFP4", "mxfp8"), ("NVFP4", "nvfp4"), ("W4A16_NVFP4", "bf16"), ("Q8_0", "bf16"), ("IQ2_XS", "bf16")]
)
@pytest.mark.parametrize("t", [5, 64, 300])
def test_a_call_on_the_cpu_reaches_both_launches_past_the_kernels_checks(rng, monkeypatch, fmt, act, t):
    """Without a GPU a call still goes as far as its two launches: the plans and arguments it hands wgmma_gemm
    (token tile, row tiles, format, table, staging scratch, alignment) pass the extension's checks, which refuse
    with a ValueError before any CUDA call; only the launch itself fails."""
    import types

    import b12x_kernels

    if torch.cuda.is_available():
        pytest.skip("the GPU tests run the launches")
    if b12x_kernels.not_built_reason():
        pytest.skip(b12x_kernels.not_built_reason())
    launches = []
    checked = b12x_kernels.wgmma_gemm

    def launch_past_the_checks(*args, **kwargs):
        with pytest.raises(RuntimeError, match="^wgmma_gemm launch"):  # a refusal would be a ValueError
            checked(*args, **kwargs)
        launches.append(kwargs["blocks"])

    monkeypatch.setattr(b12x_kernels, "wgmma_gemm", launch_past_the_checks)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: types.SimpleNamespace(cuda_stream=0))
    p, device_weights, inputs = _cpu_moe(rng, fmt, act, t, inter=256)  # IQ2: w2's K whole 256-blocks
    wg = plan.build(p.plan.query, device_weights, only=TensorCoreMoEWgmma, warm=False)
    wg.for_tokens(t).run(*inputs)
    assert len(launches) == 2 and launches[0] == launches[1] >= 1  # gate/up, then down, over the same table


# ---------------------------------------------------------------------------------------------- GPU


def _gpu_plans(rng, fmt, act_format, activation, order, t):
    """(the wgmma MoE alone, the mma.sync MoE alone, the reference on the weights the kernels multiply, inputs)."""
    inter = 256 if fmt.startswith("IQ2") else 192  # IQ2: w2's K whole 256-blocks
    x, w13, w2, weights, ids = problem(rng, fmt, act_format, activation, e=8, h=512, inter=inter, t=t, top_k=2)
    kw = dict(activation=activation, w13_order=order, max_tokens=t, top_k=2, act_format=act_format)
    p = prepared_on_cuda(w13, w2, **kw)
    wg = alone(p, w13, w2, backend=TensorCoreMoEWgmma)
    mma = alone(p, w13, w2, backend=TensorCoreMoE)
    ref = kernel_reference(bc.prepare_moe(w13, w2, **kw), mma.rows[0].backend)
    return wg, mma, ref, (x, weights, ids)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act_format", CASES, ids=str)
@pytest.mark.parametrize("activation,order", ACTIVATIONS, ids=str)
# 8 experts, top-2: about 1, 50 and 75 slots an expert, so 32-, 64- and 128-slot blocks (IQ2, whose per-chunk factor
# takes a second accumulator set: 32, 64, 64; Q8_0, GGML-packed but without one, runs 128)
@pytest.mark.parametrize("t,block", [(5, 32), (200, 64), (300, 128)])
def test_gpu_wgmma_moe_matches_reference(rng, hopper, fmt, act_format, activation, order, t, block):
    wg, mma, ref, (x, weights, ids) = _gpu_plans(rng, fmt, act_format, activation, order, t)
    row = wg.for_tokens(t)
    assert row.config["tokens"] == min(block, 64 if fmt in wgmma.FACTOR_FORMATS else block)
    x, weights, ids = x.cuda(), weights.cuda(), ids.cuda()
    workspace.poison(torch.device("cuda"))  # every temporary the kernels read, they must have written first
    y = row.run(x, weights, ids)
    close(y.cpu(), ref(x.cpu(), weights.cpu(), ids.cpu()), slack=quantizer_flips(x.cpu(), weights.cpu(), ids.cpu(),
                                                                                  ref))  # fmt: skip
    assert torch.equal(row.run(x, weights, ids), y)  # deterministic
    close(y, mma.for_tokens(t).run(x, weights, ids))  # the two forms differ only in summation order


@pytest.mark.gpu
def test_gpu_wgmma_moe_replays_in_cuda_graphs_with_new_routing(rng, hopper):
    wg, _, _, (x, weights, ids) = _gpu_plans(rng, "NVFP4", "bf16", "silu", "gate_up", 64)
    check_moe_replays_with_new_routing(wg.for_tokens(64).run, x.cuda(), weights.cuda(), ids.cuda(), experts=8)
