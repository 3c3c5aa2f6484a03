"""The fused MoE on the tensor-core GEMM (b12x_core.backends.tensor_core_moe; csrc/mma_gemm.cuh, grouped).

On CPU: the expert stack it prepares (b12x_core.mma_experts) holds every expert's checkpoint rows, gate and up
interleaved 8 by 8, with the per-tensor factors moved into row factors; and a numpy model of the kernels'
contract on that stack (the lanes' decode from mma_emulator.py, the SiLU epilogue pairing tile rows q and q + 8,
ReLU², the down GEMM's float32 slot rows, the combine) matches the b12x-core reference. On the GPU (marked gpu):
the kernels themselves at T ∈ {1, 2, 7, 64, 1024} with poisoned scratch, every MoE format × activation format ×
activation, deterministic, and replayed in a CUDA graph with new routing.
"""

from __future__ import annotations

import dataclasses

import fake_args
import numpy as np
import pytest
import torch
from closeness import close
from fake_args import FAKE
from graphs import check_moe_replays_with_new_routing
from mma_emulator import effective_weight

import b12x_core as bc
import b12x_formats as bf
from b12x_core import workspace
from b12x_core.backends import MoEShape, Overrides, Query
from b12x_core.backends.tensor_core_moe import TensorCoreMoE
from b12x_core.tensor_core import configure, geometry
from b12x_core.tensor_core import experts as mma_experts
from b12x_core.tensor_core import layout as mma_layout
from b12x_formats.kernel_facts import format_id

pytest.importorskip("triton")

from test_moe_tiles import (  # noqa: E402
    ACTIVATIONS,
    CASES,
    H200,
    alone,
    bf16_weights,
    experts,
    prepared_on_cuda,
    problem,
    quantizer_flips,
)

MOE_FORMATS = sorted({fmt for fmt, _ in CASES})


def _inter(fmt: str) -> int:
    return 256 if bf.spec(fmt).packing == "ggml" else 96  # w2's K is I: IQ2 needs whole 256-blocks


@pytest.mark.parametrize("fmt", MOE_FORMATS)
@pytest.mark.parametrize("gate_first", [True, False])
def test_expert_stack_holds_every_row_with_gate_and_up_interleaved(rng, fmt, gate_first):
    e, inter, h = 3, 16, 256
    scales = rng.uniform(0.5, 2.0, size=e).astype(np.float32) if "NVFP4" in fmt else None
    first, second = (experts(rng, fmt, e, inter, h) for _ in range(2))
    if scales is not None:  # per-expert factors that differ between the shards and the experts
        first = bf.QuantizedWeight.from_tensors(fmt, {**first.tensors, "weight_scale_2": scales})
    order = mma_experts.interleave_gate_up(inter, gate_first)
    whole, factors = mma_experts.stack_rows([first, second], order)
    got = bf.dequantize(whole).reshape(e, 2 * inter, h) * factors.reshape(e, 2 * inter, 1)
    rows = np.concatenate([bf.dequantize(first), bf.dequantize(second)], axis=1)
    gate, up = (rows[:, :inter], rows[:, inter:]) if gate_first else (rows[:, inter:], rows[:, :inter])
    tiles = got.reshape(e, inter // 8, 2, 8, h)  # tile i: 8 gate rows, then the same 8 up rows
    np.testing.assert_array_equal(tiles[:, :, 0].reshape(e, inter, h), gate)
    np.testing.assert_array_equal(tiles[:, :, 1].reshape(e, inter, h), up)


def test_interleave_refuses_an_intermediate_size_it_cannot_tile():
    with pytest.raises(ValueError, match="I % 8"):
        mma_experts.interleave_gate_up(12, True)


def _stack_values(stack: mma_experts.MmaExperts) -> torch.Tensor:
    """float32 [E·rows, K]: what the kernel multiplies each stacked row by, its row factor included (the lanes'
    decode modelled by mma_emulator on the uploaded layout)."""
    s = stack.shard
    host = [None if a is None else a.cpu().numpy().view(np.uint8) for a in (s.codes, s.meta, s.meta2)]
    mw = mma_layout.MmaWeight(s.format, stack.row_scale.numel(), s.k, s.chunks, *host, None, s.alpha, s.scale_mul)
    tables = mma_layout.iq2_tables(s.format) if s.format.startswith("IQ2") else None
    return torch.from_numpy(effective_weight(mw, tables)) * stack.row_scale.cpu()[:, None]


def kernel_reference(p, backend: TensorCoreMoE):
    """The reference on the weights the kernels multiply. bf16_weights is exact for them except IQ2, whose
    kernel rounds grid·sign·(0.5+s)/4 to bf16 and multiplies d in fp32 (not d·q rounded): two chained GEMMs
    amplify that difference past the tolerance, so IQ2 takes the lanes' decode (mma_emulator, checked against
    the format oracle in test_mma_layout.py), put back in checkpoint row order."""
    ref = bf16_weights(p)
    if p.w13_format.startswith("IQ2"):
        shape = backend.query.moe
        order = None
        if shape.activation == "silu":
            order = mma_experts.interleave_gate_up(shape.intermediate, gate_first=shape.w13_order == "gate_up")
        for name, stack, perm in (("w13", backend.w13, order), ("w2", backend.w2, None)):
            values = _stack_values(stack).reshape(shape.experts, stack.shard.n, -1)
            if perm is not None:
                values = values[:, np.argsort(perm)]
            exact = getattr(p.plan.rows[0].backend, name)  # the decode rounds once: within 2^-8 of the exact
            assert ((values - exact).abs() <= 2.0**-8 * exact.abs()).all(), f"{name}: rows out of place"
            setattr(ref, name, values)
    return ref


def kernel_model(backend: TensorCoreMoE, x, weights, ids) -> torch.Tensor:
    """The grouped kernels' contract (csrc/kernels.h MmaArgs, MmaOut) on the prepared stacks, bf16 activations:
    per slot, its expert's rows; SiLU pairs accumulator rows q and q + 8 of each 16-row tile; the intermediate
    rounds to bf16; the down GEMM's float32 rows are summed per token in slot order by their router weights."""
    shape = backend.query.moe
    w13, w2 = _stack_values(backend.w13), _stack_values(backend.w2)
    rows13 = backend.w13.shard.n
    t, k = ids.shape
    y = torch.zeros(t, shape.hidden)
    for token in range(t):
        for j in range(k):
            e = int(ids[token, j])
            acc = w13[e * rows13 : (e + 1) * rows13] @ x[token].float()
            if shape.activation == "silu":
                tiles = acc.reshape(-1, 2, 8)
                inter = torch.nn.functional.silu(tiles[:, 0]) * tiles[:, 1]
            else:
                inter = torch.relu(acc).square()
            inter = inter.reshape(-1).to(torch.bfloat16).float()
            y[token] += weights[token, j] * (w2[e * shape.hidden : (e + 1) * shape.hidden] @ inter)
    return y.to(torch.bfloat16)


@pytest.mark.parametrize("fmt", MOE_FORMATS)
@pytest.mark.parametrize("activation,order", ACTIVATIONS, ids=str)
def test_kernel_contract_on_the_prepared_stacks_matches_reference(rng, fmt, activation, order):
    x, w13, w2, weights, ids = problem(rng, fmt, "bf16", activation, e=4, h=256, inter=_inter(fmt), t=5, top_k=2)
    if "NVFP4" in fmt:  # per-expert weight_scale_2 that differ: they must land on the right rows
        w13 = bf.QuantizedWeight.from_tensors(
            fmt, {**w13.tensors, "weight_scale_2": rng.uniform(0.5, 2.0, size=4).astype(np.float32)}
        )
    kw = dict(activation=activation, w13_order=order, max_tokens=5, top_k=2)
    p = bc.prepare_moe(w13, w2, **kw)
    backend = alone(p, w13, w2, backend=TensorCoreMoE).rows[0].backend
    close(kernel_model(backend, x, weights, ids), kernel_reference(p, backend)(x, weights, ids))


def _query(device_info, max_tokens, **shape) -> Query:
    moe = MoEShape(**{**dict(experts=128, hidden=2048, intermediate=768, top_k=8, activation="silu",
                             w13_order="gate_up", act_mode_2="bf16", w2_format="MXFP4"), **shape})  # fmt: skip
    rows = 2 * moe.intermediate if moe.activation == "silu" else moe.intermediate
    return Query("moe", "MXFP4", "bf16", "bf16", device_info, n=rows, k=moe.hidden, max_tokens=max_tokens, moe=moe)


CUDA_H200 = dataclasses.replace(H200, device=torch.device("cuda"))


@pytest.mark.parametrize(
    "shape,why",
    [
        (dict(intermediate=12), "% 16"),  # gated: 2I = 24 rows per expert, not whole 16-row tiles
        (dict(intermediate=40, activation="relu2"), "% 16"),
        (dict(act_mode_2="fp8_dynamic"), "bf16-exact"),
    ],
)
def test_declines_what_its_layout_cannot_hold(shape, why):
    ok, reason = TensorCoreMoE.can_implement(_query(CUDA_H200, 8, **shape))
    assert not ok and why in reason


def test_declines_off_cuda():
    ok, reason = TensorCoreMoE.can_implement(_query(H200, 8))
    assert not ok and "CUDA" in reason


@pytest.mark.parametrize("top_k,experts,hidden,inter", [(8, 128, 2048, 768), (4, 128, 2048, 768), (8, 256, 2048, 768),
                                                       (1, 4, 4096, 128), (2, 8, 512, 256)])  # fmt: skip
def test_configurations_cover_every_token_count_and_split_k_only_when_few_tiles(top_k, experts, hidden, inter):
    """K is split only where a GEMM's expected busy output tiles (busy table blocks × 128-row tiles) fill less than
    SPLIT_BELOW_SMS of the SMs: the model-sized layers keep it whole at every token count, small ones split at one
    token."""

    query = _query(H200, 4096, top_k=top_k, experts=experts, hidden=hidden, intermediate=inter)
    rows = TensorCoreMoE.configs(query, 1, 4096)
    assert rows[0][0] == 1 and rows[-1][1] == 4096
    assert all(a[1] + 1 == b[0] for a, b in zip(rows, rows[1:], strict=False))
    first, last = rows[0][2], rows[-1][2]
    assert first["tokens"] == 8  # one token: 8-slot blocks
    busy = min(top_k, experts)  # one token's busy blocks
    for tiles, split in (
        (busy * -(-2 * inter // 128), first["splits"][0]),
        (busy * -(-hidden // 128), first["splits"][1]),
    ):
        if tiles >= configure.SPLIT_BELOW_SMS * H200.sms:
            assert split == 1, (tiles, split)
    if (top_k, experts, hidden, inter) == (1, 4, 4096, 128):  # two busy tiles over 32 chunks: split to fill SMs
        assert first["splits"][0] > 1
    assert last["splits"] == (1, 1)  # 4096 tokens fill the GPU many times over
    if first["splits"][0] > 1:
        blocks = TensorCoreMoE.table_blocks(query, rows[0][1], first)
        assert TensorCoreMoE.tickets(query, rows) >= blocks * -(-2 * inter // 128)


@pytest.mark.parametrize(
    "top_k,experts,hidden,inter", [(8, 128, 2048, 768), (4, 128, 2880, 2880), (8, 256, 7168, 2048)]
)
def test_held_rows_only_at_eight_slot_blocks_within_the_measured_bytes(top_k, experts, hidden, inter):
    """Held rows (Overrides.holds_rows on): a configuration holds a GEMM's block rows only at 8-slot blocks and only
    where 8 rows over its split's K fit configure.RESIDENT_MAX_BYTES, and names x_quant only where held and the format's
    kernel quantizes the mode; forced off, no configuration holds or quantizes anything."""
    for fmt, act in (("MXFP4", "mxfp8"), ("NVFP4", "nvfp4"), ("IQ2_XS", "bf16")):
        shape = MoEShape(experts=experts, hidden=hidden, intermediate=inter, top_k=top_k, activation="silu",
                         w13_order="gate_up", act_mode_2=act, w2_format=fmt)  # fmt: skip
        q = Query("moe", fmt, act, act, H200, n=2 * inter, k=hidden, max_tokens=4096, moe=shape)
        off = dataclasses.replace(q, overrides=Overrides(holds_rows=False))
        assert all("held" not in c for _, _, c in TensorCoreMoE.configs(off, 1, 4096))
        on = dataclasses.replace(q, overrides=Overrides(holds_rows=True))
        for _, last, config in TensorCoreMoE.configs(on, 1, 4096):
            if config["tokens"] != 8:
                assert "held" not in config
                continue
            for i, (k, mode) in enumerate(((hidden, act), (inter, act))):
                chunks = -(-k // geometry.chunk_k(fmt))
                split_k = -(-chunks // config["splits"][i]) * geometry.chunk_k(fmt)
                fits = min(last * top_k, 8) * split_k * 2 <= configure.RESIDENT_MAX_BYTES
                assert config["held"][i] == fits, (last, config)
                in_kernel = fits and fmt in geometry.MMA.x_quant_formats.get(mode, ())
                assert config["x_quant"][i] == (mode if in_kernel else "none")


@pytest.mark.parametrize("held_faster_at", [(1,), (1, 2), (4, 8), ()])
def test_held_rows_where_the_measured_table_has_them_faster(monkeypatch, held_faster_at):
    """Unforced (Overrides.holds_rows None), a token count holds its block rows exactly where the MoE table has
    configure.HELD faster than the staged tensor_core_moe at that count; with no entry, nowhere."""
    from b12x_core import timings

    shape = MoEShape(experts=128, hidden=2048, intermediate=768, top_k=8, activation="silu", w13_order="gate_up",
                     act_mode_2="mxfp8", w2_format="MXFP4")  # fmt: skip
    q = Query("moe", "MXFP4", "mxfp8", "mxfp8", H200, n=1536, k=2048, max_tokens=8, moe=shape)
    ms = (1, 2, 4, 8)
    staged = tuple(50.0 + 10 * m for m in ms)
    held = tuple(t + (-3.0 if m in held_faster_at else 3.0) for m, t in zip(ms, staged, strict=True))
    entry = timings.Entry((9, 0), "MXFP4", "mxfp8", timings.shape_class(1536, 2048), ms,
                          {"tensor_core_moe": staged, configure.HELD: held}, "test", op="moe")  # fmt: skip
    monkeypatch.setattr(timings, "load", lambda *_: (entry,))
    for m in ms:
        assert ("held" in TensorCoreMoE.call_config(q, m)) == (m in held_faster_at), m
    monkeypatch.setattr(timings, "load", lambda *_: ())
    assert all("held" not in TensorCoreMoE.call_config(q, m) for m in ms)


@pytest.mark.parametrize("capability", [(9, 0), (12, 0), (12, 1)], ids=lambda c: f"sm_{c[0]}{c[1]}")
def test_an_unmeasured_plan_runs_the_tensor_core_moe_where_the_extension_can(capability):
    """Unmeasured (no timing row: an SM12x GPU), the conservative plan runs the tensor-core MoE, which the H200
    measured faster than the Triton MoE at every point, and lists the Triton MoE as the runner-up with the reason;
    without the CUDA extension the Triton MoE runs it."""
    from b12x_core import plan

    device = dataclasses.replace(CUDA_H200, capability=capability)
    basis, _, decisions = plan.choose(_query(device, 64), entries=[])
    assert "conservative defaults" in basis
    assert [d.backend.name for d in decisions] == ["tensor_core_moe"]
    assert "default order" in dict(decisions[0].lost)["triton_moe"]
    without = dataclasses.replace(device, kernels="b12x_kernels' CUDA extension is not built")
    assert [d.backend.name for d in plan.choose(_query(without, 64), entries=[])[2]] == ["triton_moe"]


@pytest.mark.parametrize(
    "fields,call,why",
    [
        (dict(epilogue=7), {}, "unknown epilogue"),
        (dict(epilogue=1, N=24), {}, "silu needs N % 16"),
        (dict(epilogue=3), {}, "needs partials"),
        (dict(splits=2, chunks=4), dict(partials=16), "needs tickets"),
        (dict(mt=3), {}, "mt must be"),
        (dict(chunks=0), {}, "fewer than K columns"),
        (dict(tiles=7, mt=2), {}, "tiles must be"),
        (dict(tiles=5), {}, "tiles must be"),
        ({}, dict(order=16), "grouped needs the block table"),
        (dict(resident=1, mt=2), {}, "resident activations need mt 1"),
        (dict(resident=1, rt=2), {}, "resident activations need mt 1"),
        (dict(resident=1, N=32, K=32768, chunks=1024), dict(M=8, order=16, table=16, blocks=4), "exceed 227 KB"),
        (dict(resident=1, K=32768, chunks=1024), dict(M=8), "exceed 227 KB"),
        (dict(x_quant=1, x_quant_scale=1.0), {}, "x_quant .* needs resident activations"),
        (dict(resident=1, x_quant=3, x_quant_scale=1.0), {}, "does not quantize"),  # nvfp4 needs NVFP4 weights
        (dict(format=format_id("FP8"), chunks=4, resident=1, x_quant=2), {}, "does not quantize"),
        (dict(format=format_id("FP8"), chunks=4, resident=1, x_quant=9, x_quant_scale=1.0), {}, "does not quantize"),
        (dict(format=format_id("FP8"), chunks=4, resident=1, x_quant=1, x_quant_scale=-1.0), {}, "positive and finite"),
        (dict(format=format_id("FP8"), chunks=4, resident=1, x_quant=1), {}, "positive and finite"),
        (dict(format=format_id("NVFP4"), resident=1, x_quant=3, x_quant_scale=float("inf")), {}, "positive and finite"),
        (dict(N=40), dict(order=16, table=16, blocks=4), "N % 16"),
        ({}, dict(ids=16, experts=8, blocks=2, order=16, table=16), "not both"),
        ({}, dict(ids=16, experts=8, blocks=0), "routed in the kernel"),
        ({}, dict(ids=16, experts=0, blocks=2), "routed in the kernel"),
        ({}, dict(ids=16, experts=1025, blocks=2), "routed in the kernel"),
        ({}, dict(ids=16, experts=8, blocks=2, M=1025), "routed in the kernel"),
        (dict(N=40), dict(ids=16, experts=8, blocks=2), "routed in the kernel"),
        ({}, dict(ids=16, experts=8, blocks=2, combine_w=16, combine_k=1, tickets=16), "combine .* needs the f32"),
        (dict(epilogue=3), dict(partials=16, combine_w=16, combine_k=1, tickets=16), "combine .* needs the f32"),
        (
            dict(epilogue=3),
            dict(partials=16, ids=16, experts=8, blocks=2, combine_w=16, combine_k=1),
            "combine .* needs the f32",
        ),
        (
            dict(epilogue=3),
            dict(partials=16, ids=16, experts=8, blocks=2, combine_w=16, combine_k=2, M=3, tickets=16),
            "multiple of combine_k",
        ),
        ("short", {}, "interface.h differ"),
    ],
)
def test_kernel_entry_refuses_what_it_cannot_run_before_launching(fields, call, why):
    """The extension's checks run before any CUDA call, so they hold on a machine without a GPU too."""
    import b12x_kernels

    if b12x_kernels._C is None:
        pytest.skip(b12x_kernels.unavailable_reason())
    packed = b"\0" * 8 if fields == "short" else fake_args.mma_args(**{"format": 4, **fields})
    args = dict(x=FAKE, bias=0, y=FAKE, M=1, partials=0, tickets=0, stream=0)
    with pytest.raises(ValueError, match=why):
        b12x_kernels.mma_gemm(packed, **{**args, **call})


def test_kernel_entry_quantizes_held_activations_only_for_the_pairs_it_has():
    """x_quant: every weight format × activation mode outside geometry.MMA.x_quant_formats is refused before any CUDA
    call (the pairs inside it are the GPU test's, test_mma_gemm.py)."""
    import b12x_kernels
    from b12x_core.tensor_core import geometry
    from b12x_kernels import interface

    if b12x_kernels._C is None:
        pytest.skip(b12x_kernels.unavailable_reason())
    for fmt in mma_layout.FORMATS:
        for mode in interface.X_QUANTS[1:]:
            if format_id(fmt) in {format_id(f) for f in geometry.MMA.x_quant_formats[mode]}:
                continue  # the kernel goes by the format's number: W4A16_NVFP4 runs NVFP4's
            packed = fake_args.mma_args(format=format_id(fmt), meta2=FAKE, block_scale=FAKE, tables=FAKE, K=256,
                                        chunks=256 // geometry.chunk_k(fmt), resident=1,
                                        x_quant=interface.X_QUANTS.index(mode), x_quant_scale=1.0)  # fmt: skip
            args = dict(x=FAKE, bias=0, y=FAKE, M=1, partials=0, tickets=0, stream=0)
            with pytest.raises(ValueError, match="does not quantize"):
                b12x_kernels.mma_gemm(packed, **args)


# ---------------------------------------------------------------------------------------------- GPU


def _gpu_plan(rng, fmt, act_format, activation, order, t, e=8, h=512):
    inter = 256 if bf.spec(fmt).packing == "ggml" else 192
    x, w13, w2, weights, ids = problem(rng, fmt, act_format, activation, e=e, h=h, inter=inter, t=t, top_k=2)
    kw = dict(activation=activation, w13_order=order, max_tokens=t, top_k=2, act_format=act_format)
    gpu = alone(prepared_on_cuda(w13, w2, **kw), w13, w2, backend=TensorCoreMoE)
    return gpu, kernel_reference(bc.prepare_moe(w13, w2, **kw), gpu.rows[0].backend), (x, weights, ids)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act_format", CASES, ids=str)
@pytest.mark.parametrize("activation,order", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("t", [1, 2, 7, 64, 1024])
def test_gpu_tensor_core_moe_matches_reference(rng, fmt, act_format, activation, order, t):
    gpu, ref, (x, weights, ids) = _gpu_plan(rng, fmt, act_format, activation, order, t)
    row = gpu.for_tokens(t)
    workspace.poison(torch.device("cuda"))  # every temporary the kernels read, they must have written first
    y = row.run(x.cuda(), weights.cuda(), ids.cuda())
    close(y.cpu(), ref(x, weights, ids), slack=quantizer_flips(x, weights, ids, ref))
    assert torch.equal(row.run(x.cuda(), weights.cuda(), ids.cuda()), y)  # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act_format", CASES, ids=str)
@pytest.mark.parametrize("t", [1, 3])  # 2 and 6 slots: blocks of one slot, and of several
def test_gpu_held_rows_give_the_staged_bits(rng, fmt, act_format, t):
    """Held rows (Overrides.holds_rows on): 8-slot blocks hold each GEMM's gathered rows (quantized in the kernel for the
    pairs it has) and give the same bits as the staged kernels (forced off) after the operand passes, on the same
    prepared weights."""
    inter = 256 if bf.spec(fmt).packing == "ggml" else 192
    x, w13, w2, weights, ids = problem(rng, fmt, act_format, "silu", e=8, h=512, inter=inter, t=t, top_k=2)
    kw = dict(activation="silu", w13_order="gate_up", max_tokens=t, top_k=2, act_format=act_format)
    p = prepared_on_cuda(w13, w2, **kw)
    staged = alone(p, w13, w2, backend=TensorCoreMoE, overrides=Overrides(holds_rows=False)).for_tokens(t)
    held = alone(p, w13, w2, backend=TensorCoreMoE, overrides=Overrides(holds_rows=True)).for_tokens(t)
    assert held.config["held"] == (True, True) and "held" not in staged.config
    quantized = act_format != "bf16" and fmt in geometry.MMA.x_quant_formats.get(p.act_mode_13, ())
    assert held.config["x_quant"][0] == (p.act_mode_13 if quantized else "none")
    x, weights, ids = x.cuda(), weights.cuda(), ids.cuda()
    workspace.poison(torch.device("cuda"))
    y = held.run(x, weights, ids)
    assert torch.equal(y, staged.run(x, weights, ids))
    assert torch.equal(held.run(x, weights, ids), y)  # deterministic


def test_fused_routing_and_combine_only_for_decode_sized_calls():
    """Up to FUSED_MAX_SLOTS slots a call routes in its GEMMs and combines in the down GEMM (route "gemm"), past it
    the table is made apart; forced off, never; forced on, up to the kernel's routing limits. The tickets the plan
    reserves cover the down GEMM's output tiles wherever a row is fused."""
    from b12x_kernels import interface

    for top_k, n_experts, hidden in ((8, 128, 2048), (4, 128, 2880), (8, 1025, 2048)):
        query = _query(H200, 4096, top_k=top_k, experts=n_experts, hidden=hidden, intermediate=768)
        for fuses in (None, False, True):
            query = dataclasses.replace(query, overrides=Overrides(fuses=fuses))
            rows = TensorCoreMoE.configs(query, 1, 4096)
            for first, last, config in rows:
                for t in (first, last):
                    slots = t * top_k
                    limits = slots <= interface.ROUTE_MAX_SLOTS and n_experts <= interface.ROUTE_MAX_EXPERTS
                    wanted = fuses if fuses is not None else slots <= configure.FUSED_MAX_SLOTS
                    assert (config["route"] == "gemm") == (limits and wanted), (fuses, t, config)
            if any(config["route"] == "gemm" for _, _, config in rows):
                assert TensorCoreMoE.tickets(query, rows) >= -(-hidden // 128)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act_format,e,h,inter", [("NVFP4", "nvfp4", 8, 512, 192), ("IQ2_XS", "bf16", 8, 512, 256),
                                                      ("MXFP4", "mxfp8", 300, 128, 64)])  # fmt: skip
@pytest.mark.parametrize("t,routing", [(1, "random"), (1, "one expert"), (3, "random"), (16, "one expert"),
                                       (16, "random"), (64, "random")])  # fmt: skip
def test_gpu_fused_routing_and_combine_give_the_unfused_bits(rng, fmt, act_format, e, h, inter, t, routing):
    """Routed in the GEMMs and combined in the down GEMM (Overrides.fuses on) against the table and the combine launched apart
    (off): the same bits, for random routing and for every slot on one expert (several blocks of one expert, idle
    CTAs taking their tickets), over more experts than a CTA has threads (300), held rows and staged."""
    x, w13, w2, weights, ids = problem(rng, fmt, act_format, "silu", e=e, h=h, inter=inter, t=t, top_k=2)
    if routing == "one expert":
        ids = torch.full_like(ids, int(rng.integers(0, e)))
    kw = dict(activation="silu", w13_order="gate_up", max_tokens=t, top_k=2, act_format=act_format)
    p = prepared_on_cuda(w13, w2, **kw)
    x, weights, ids = x.cuda(), weights.cuda(), ids.cuda()
    for holds in (False, True):
        apart = alone(p, w13, w2, backend=TensorCoreMoE, overrides=Overrides(holds_rows=holds, fuses=False))
        fused = alone(p, w13, w2, backend=TensorCoreMoE, overrides=Overrides(holds_rows=holds, fuses=True))
        apart, fused = apart.for_tokens(t), fused.for_tokens(t)
        assert fused.config["route"] == "gemm" and apart.config["route"] != "gemm"
        workspace.poison(torch.device("cuda"))
        y = fused.run(x, weights, ids)
        assert torch.equal(y, apart.run(x, weights, ids)), holds
        assert torch.equal(fused.run(x, weights, ids), y)  # deterministic, tickets left at zero


@pytest.mark.gpu
@pytest.mark.parametrize("holds", [False, True], ids=["staged", "held"])
# fused routing and combine (2, 6 slots), the table and the combine apart (64 tokens), and a gate/up GEMM whose 8 K
# chunks the plan splits over 10 output tiles of 112 rows (the split-K tickets counted by the CTA's rows)
@pytest.mark.parametrize("t,h", [(1, 512), (3, 512), (64, 512), (1, 2048)])
def test_gpu_short_ctas_planned_for_sm12x_match_reference(rng, holds, t, h):
    """IQ2_XS's MoE planned for an SM12x GPU's 99 KB a block (Overrides.short_ctas, on by default): both GEMMs in 112-row
    CTAs at 8-slot blocks, run on this GPU as SM12x's proxy: against the reference on the weights the kernels
    multiply, deterministic, and within the tolerance of the 128-row CTAs' result (the K splits may differ)."""
    # the case this test is for: IQ2_XS's 128-row CTA (its 40 KB of tables) past SM12x's 99 KB a block
    assert geometry.fitting_heights("IQ2_XS", 99 * 1024)[:1] != (geometry.FULL_HEIGHT,)
    x, w13, w2, weights, ids = problem(rng, "IQ2_XS", "bf16", "silu", e=8, h=h, inter=256, t=t, top_k=2)
    kw = dict(activation="silu", w13_order="gate_up", max_tokens=t, top_k=2, act_format="bf16")
    p = prepared_on_cuda(w13, w2, **kw)
    forced = Overrides(holds_rows=holds, short_ctas=True)
    sm12x = dataclasses.replace(p.plan.query.device, smem_kb=99)
    short = alone(p, w13, w2, device_info=sm12x, backend=TensorCoreMoE, overrides=forced)
    full = alone(p, w13, w2, backend=TensorCoreMoE, overrides=forced)
    row = short.for_tokens(t)
    assert row.config["rows"] < 128 and "rows" not in full.for_tokens(t).config
    assert (row.config["splits"][0] > 1) == (h == 2048)
    ref = kernel_reference(bc.prepare_moe(w13, w2, **kw), full.rows[0].backend)
    x, weights, ids = x.cuda(), weights.cuda(), ids.cuda()
    workspace.poison(torch.device("cuda"))
    y = row.run(x, weights, ids)
    close(y.cpu(), ref(x.cpu(), weights.cpu(), ids.cpu()),
          slack=quantizer_flips(x.cpu(), weights.cpu(), ids.cpu(), ref))  # fmt: skip
    assert torch.equal(row.run(x, weights, ids), y)  # deterministic, tickets left at zero
    close(y, full.for_tokens(t).run(x, weights, ids))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 40])  # split-K gate/up (tickets) and whole-K 16-slot blocks
def test_gpu_tensor_core_moe_replays_in_cuda_graphs_with_new_routing(rng, t):
    gpu, _, (x, weights, ids) = _gpu_plan(rng, "IQ2_XS", "bf16", "silu", "up_gate", t)
    check_moe_replays_with_new_routing(gpu.for_tokens(t).run, x.cuda(), weights.cuda(), ids.cuda(), experts=8)
