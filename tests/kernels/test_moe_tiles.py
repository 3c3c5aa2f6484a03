"""The fused-MoE Triton backend (b12x_core.backends.triton_moe: expert-sorted slots, grouped GEMMs with the
activation fused, deterministic combine) against the b12x-core reference, every MoE format × activation format ×
activation.

On CPU the kernels run in Triton's interpreter (conftest.py), through a plan of that backend alone; on the GPU
(marked gpu) through a plan of that backend alone at T ∈ {1, 2, 7, 64, 1024}. Tolerance as the linear tiles (closeness.py), against the
reference run on the weights the kernels multiply: decoded and rounded to bf16 (exact for the FP4 formats; one
rounding of d·q for Q8_0 and IQ2, which two chained GEMMs would otherwise amplify past 1e-2).
"""

from __future__ import annotations

import dataclasses
import functools
import unittest.mock

import numpy as np
import pytest
import torch
from closeness import close
from graphs import capture
from hypothesis import given, settings
from hypothesis import strategies as st

import b12x_core as bc
import b12x_formats as bf

pytest.importorskip("triton")

from b12x_core import plan, workspace  # noqa: E402
from b12x_core.activations import quantize_activation  # noqa: E402
from b12x_core.backends import DeviceInfo  # noqa: E402
from b12x_core.backends.reference import expert_activation, moe_reference  # noqa: E402
from b12x_core.backends.triton_moe import TritonMoE, call_config  # noqa: E402
from b12x_core.moe import MOE_FORMATS  # noqa: E402
from b12x_core.moe_blocks import block_table, block_table_torch, max_blocks  # noqa: E402
from b12x_core.weights import DeviceWeights, as_shards  # noqa: E402

CASES = [(fmt, act) for fmt, acts in MOE_FORMATS.items() for act in acts]
ACTIVATIONS = [("silu", "gate_up"), ("silu", "up_gate"), ("relu2", "gate_up")]


def random_iq2_experts(rng, fmt, e, n, k) -> bf.QuantizedWeight:
    """Valid IQ2 blocks from random bytes: every grid index, sign pattern and sub-block scale is a code the kernels
    must decode, so random bytes meet all of them (the IQ2 search on the host took most of the GPU suite's MoE time,
    30-55 s a test). Each block's fp16 d is drawn so the weights come out near N(0, 1/k), as quantized ones: random
    blocks decode to an RMS of about 55·d."""
    spec = bf.spec(fmt)
    blocks = rng.integers(0, 256, size=(e, n, k // spec.group_size, spec.block_bytes), dtype=np.uint8)
    d = rng.uniform(0.5, 1.5, size=blocks.shape[:-1]) / (55.0 * np.sqrt(k))
    blocks[..., :2] = d.astype(np.float16)[..., None].view(np.uint8)
    return bf.QuantizedWeight.from_tensors(fmt, {"weight": blocks})


def experts(rng, fmt, e, n, k, input_scale=None):
    if fmt.startswith("IQ2"):
        return random_iq2_experts(rng, fmt, e, n, k)
    qw = bf.quantize((rng.standard_normal((e, n, k)) / np.sqrt(k)).astype(np.float32), fmt)
    if input_scale is not None:
        qw = bf.QuantizedWeight.from_tensors(fmt, {**qw.tensors, "input_scale": np.full(e, input_scale, np.float32)})
    return qw


def problem(rng, fmt, act_format, activation, e, h, inter, t, top_k):
    x = torch.from_numpy(rng.standard_normal((t, h)).astype(np.float32)).to(torch.bfloat16)
    nv = act_format == "nvfp4"
    w13 = experts(
        rng,
        fmt,
        e,
        2 * inter if activation == "silu" else inter,
        h,
        float(x.float().abs().max()) / 2688 if nv else None,
    )
    w2 = experts(rng, fmt, e, h, inter, 4.0 / 2688 if nv else None)
    weights, ids = bc.route_topk(torch.from_numpy(rng.standard_normal((t, e)).astype(np.float32)), top_k)
    return x, w13, w2, weights, ids


class Reference:
    """The reference's operands of a prepared MoE: its query (modes, shape), exact weights and input scales."""

    def __init__(self, p, bf16_ggml=True):
        backend = p.plan.rows[0].backend
        self.query, self.input_scales = p.plan.query, backend.input_scales
        self.w13, self.w2 = backend.w13, backend.w2
        if bf16_ggml and bf.spec(p.w13_format).packing == "ggml":  # as the kernels decode them
            self.w13, self.w2 = self.w13.to(torch.bfloat16).float(), self.w2.to(torch.bfloat16).float()
        shape = self.query.moe
        self.experts, self.hidden, self.intermediate = shape.experts, shape.hidden, shape.intermediate
        self.activation, self.w13_order = shape.activation, shape.w13_order
        self.act_mode_13, self.act_mode_2 = self.query.act_mode, shape.act_mode_2
        self.input_scale_13, self.input_scale_2 = self.input_scales

    def __call__(self, x, weights, ids):
        return moe_reference(x, weights, ids, self.query, self.w13, self.w2, self.input_scales)


def bf16_weights(p):
    """The reference on the kernels' operands: GGML weights rounded to bf16 as the kernels decode them (the
    other formats decode exactly; their per-tensor factors apply in float32 after the dot)."""
    return Reference(p)


def quantizer_flips(x, weights, ids, p) -> torch.Tensor:
    """Per output element, what quantizing the second GEMM's input can move between kernels and reference.
    Where the float32 intermediate sits within 2e-5 of a bf16 rounding midpoint, the kernels (summing in another
    order, on tensor cores) may round it to the other neighbour; quantized to mxfp8/nvfp4, that can cross a
    quantizer boundary or change its group's scale. Measured, not guessed: the quantized intermediate with such
    elements moved (all of them; those below their row's largest; the largest alone) against the unmoved one.
    Zero for bf16 activations, which the ulp term covers."""
    bound = torch.zeros(x.shape[0], p.hidden, dtype=torch.float32)
    if p.act_mode_2 == "bf16":
        return bound
    xq = quantize_activation(x, p.act_mode_13, p.input_scale_13)
    for e in range(p.experts):
        tokens, slots = (ids == e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        a32 = expert_activation(xq[tokens] @ p.w13[e].T, p)
        a = a32.to(torch.bfloat16).float()
        ulp = torch.ldexp(torch.ones_like(a), torch.frexp(a)[1] - 8)  # bf16: 8 significant bits
        near = ((a32 - a).abs() - ulp / 2).abs() <= 2e-5 * a32.abs()
        largest = a.abs() >= 0.5 * a.abs().amax(dim=1, keepdim=True)  # candidates for a group's scale
        q = quantize_activation(a, p.act_mode_2, p.input_scale_2)
        delta = torch.zeros_like(a)
        for moves in (near, near & ~largest, near & largest):
            moved = torch.where(moves, a + torch.sign(a32 - a) * ulp, a)
            delta += (quantize_activation(moved, p.act_mode_2, p.input_scale_2) - q).abs()
        bound.index_add_(0, tokens, (delta @ p.w2[e].abs().T) * weights[tokens, slots, None])
    return bound


def test_block_table_covers_every_slot_once():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [3, 2], [1, 3]])
    order, blocks = block_table(ids, experts=5, rows_per_block=2, route="torch")
    assert blocks.dtype == torch.int32 and blocks.shape[0] == 3 and blocks.is_contiguous()  # one pointer for kernels
    expert, start, rows = blocks
    assert expert.numel() == max_blocks(10, 5, 2)  # a fixed launch whatever the routing
    covered = []
    for b in range(expert.numel()):
        if expert[b] < 0:
            continue
        for i in range(int(rows[b])):
            slot = int(order[int(start[b]) + i])
            assert int(ids.reshape(-1)[slot]) == int(expert[b])
            covered.append(slot)
    assert sorted(covered) == list(range(10))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_block_table_launches_the_fewest_blocks_any_routing_needs(data):
    """max_blocks is the tight bound: the table of any routing covers every slot in that many blocks (idle blocks
    last), and the worst routing (each touched expert one slot past a multiple of R) fills exactly that many."""
    experts = data.draw(st.integers(1, 160))
    top_k = data.draw(st.integers(1, min(8, experts)))
    tokens = data.draw(st.integers(1, 40))
    rows = data.draw(st.sampled_from([1, 2, 8, 16, 64]))
    slots = tokens * top_k
    most = max_blocks(slots, experts, rows)
    assert most <= -(-slots // rows) + experts
    chosen = data.draw(st.lists(st.integers(0, experts - 1), min_size=slots, max_size=slots))
    ids = torch.tensor(chosen, dtype=torch.int32).reshape(tokens, top_k)
    order, (expert, start, count) = block_table_torch(ids, experts, rows)
    live = int((expert >= 0).sum())
    assert expert.numel() == most and live <= most and bool((expert[live:] < 0).all())
    assert int(count[:live].sum()) == slots and sorted(order.tolist()) == list(range(slots))
    # the worst routing: every touched expert one slot, the rest R at a time (each R a block more), the remainder
    # (< R) on expert 0, where it adds no block
    touched = min(experts, slots)
    per = [1] * touched
    for i in range((slots - touched) // rows):
        per[i % touched] += rows
    per[0] += slots - sum(per)
    worst = torch.tensor([e for e in range(touched) for _ in range(per[e])], dtype=torch.int32)
    worst = worst[torch.from_numpy(np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).permutation(slots))]
    expert = block_table_torch(worst.reshape(tokens, top_k), experts, rows)[1][0]
    assert int((expert >= 0).sum()) == most


@pytest.mark.parametrize("tokens,top_k,experts,rows_per_block", [(1, 8, 128, 16), (7, 2, 5, 16), (64, 8, 256, 16),
                                                                  (128, 8, 60, 64), (1, 1, 1, 16)])  # fmt: skip
def test_routing_kernel_matches_torch_tables(rng, tokens, top_k, experts, rows_per_block):
    """The one-launch routing tables (b12x_kernels.moe_route) equal the torch ops' on every block with work."""
    logits = torch.from_numpy(rng.standard_normal((tokens, experts)).astype(np.float32))
    ids = bc.route_topk(logits, top_k)[1]
    if rng.random() < 0.5:  # crowd the low experts: several blocks for one expert
        ids = ids % max(1, experts // 8)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    order, blocks = block_table(ids.to(device), experts, rows_per_block, route="kernel")
    fused = [order.cpu(), *blocks.cpu()]
    ref_order, ref_blocks = block_table_torch(ids, experts, rows_per_block)
    ref = [ref_order, *ref_blocks]
    assert torch.equal(fused[0], ref[0]) and torch.equal(fused[1], ref[1])
    work = ref[1] >= 0
    assert torch.equal(fused[2][work], ref[2][work]) and torch.equal(fused[3][work], ref[3][work])


def prepared_on_cuda(w13, w2, **kw):
    """bc.prepare_moe on the GPU without warming its dispatched plan: the tests that take this build the backend they
    test alone (`alone`), so a compile and a run of every dispatched row up to max_tokens was wasted work."""
    with unittest.mock.patch.object(plan, "build", functools.partial(plan.build, warm=False)):
        return bc.prepare_moe(w13, w2, device="cuda", **kw)


def alone(p, w13, w2, device_info=None, backend=TritonMoE, overrides=None):
    """A plan of one MoE backend (the Triton one unless told) alone for a prepared MoE's query (on
    `device_info`: another device's SM count and shared memory; with `overrides`, a backends.Overrides), unwarmed."""
    query = p.plan.query if device_info is None else dataclasses.replace(p.plan.query, device=device_info)
    query = query if overrides is None else dataclasses.replace(query, overrides=overrides)
    weights = (DeviceWeights(as_shards(w13), p.act_mode_13, p.input_scale_13, p.device),
               DeviceWeights([w2], p.act_mode_2, p.input_scale_2, p.device))  # fmt: skip
    return plan.build(query, weights, only=backend, warm=False)


def interpreted(rng, fmt, act_format, activation, order, t, device_info=None):
    """The Triton MoE backend in Triton's interpreter against the reference (tolerance: closeness.py + flips)."""
    inter = 256 if bf.spec(fmt).packing == "ggml" else 96  # w2's K is I: IQ2 needs whole 256-blocks
    x, w13, w2, weights, ids = problem(rng, fmt, act_format, activation, e=4, h=256, inter=inter, t=t, top_k=2)
    p = bc.prepare_moe(w13, w2, activation=activation, w13_order=order, max_tokens=t, top_k=2, act_format=act_format)
    tiles = alone(p, w13, w2, device_info)
    workspace.poison(p.device)
    ref = bf16_weights(p)
    close(tiles.for_tokens(t).run(x, weights, ids), ref(x, weights, ids), slack=quantizer_flips(x, weights, ids, ref))
    return tiles.for_tokens(t)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests below run the compiled kernels")
@pytest.mark.parametrize("fmt,act_format", CASES, ids=str)
@pytest.mark.parametrize("activation,order", ACTIVATIONS, ids=str)
def test_interpreted_moe_matches_reference(rng, fmt, act_format, activation, order):
    interpreted(rng, fmt, act_format, activation, order, t=7)


H200 = DeviceInfo(torch.device("cpu"), (9, 0), sms=132, smem_kb=228)  # its budgets, the tensors on the CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests below run the compiled kernels")
@pytest.mark.parametrize("t", [40, 160])  # 20 and 80 rows per expert: 64- and 128-row blocks
@pytest.mark.parametrize("fmt,act_format,activation,order", [("MXFP4", "mxfp8", "silu", "up_gate"),
                                                             ("Q8_0", "bf16", "relu2", "gate_up")])  # fmt: skip
def test_interpreted_moe_prefill_configurations(rng, fmt, act_format, activation, order, t):
    row = interpreted(rng, fmt, act_format, activation, order, t, device_info=H200)
    assert row.config["gate_up"]["block_m"] == (64 if t == 40 else 128)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests below run the compiled kernels")
@pytest.mark.parametrize("fmt,act_format,activation,order", [("NVFP4", "nvfp4", "silu", "up_gate"),
                                                             ("IQ2_XXS", "bf16", "relu2", "gate_up")])  # fmt: skip
def test_interpreted_moe_splits_k(rng, fmt, act_format, activation, order):
    """Both GEMMs split along K (a device with enough SMs that each split is one K step), the splits added in
    order."""
    row = interpreted(rng, fmt, act_format, activation, order, t=3, device_info=DeviceInfo(torch.device("cpu"), sms=64))
    assert row.config["k_split"] == (128, 128)  # K = 256 both: two splits each


def moe_plan(device_info, max_tokens, **shape):
    """The Triton MoE plan rows of a hypothetical MoE layer on `device_info` (no weights: configurations only)."""
    from b12x_core.backends import MoEShape, Query

    moe = MoEShape(**{**dict(experts=128, hidden=2048, intermediate=768, top_k=8, activation="silu",
                             w13_order="gate_up", act_mode_2="bf16", w2_format="MXFP4"), **shape})  # fmt: skip
    query = Query("moe", "MXFP4", "bf16", "bf16", device_info, n=2 * moe.intermediate, k=moe.hidden,
                  max_tokens=max_tokens, moe=moe)  # fmt: skip
    return moe, TritonMoE.configs(query, 1, max_tokens)  # configurations need no weights


@pytest.mark.parametrize("device_info", [H200, DeviceInfo(torch.device("cpu"), (12, 0), sms=170, smem_kb=99)])
def test_moe_rows_cover_every_token_count_and_split_only_decode(device_info):
    """The rows tile 1..max_tokens; split K happens only in 16-row-block rows; 128-row blocks only where the
    shared memory holds them; every row's configuration is what a call of any of its token counts gets."""
    shape, rows = moe_plan(device_info, 3000)
    assert rows[0][0] == 1 and rows[-1][1] == 3000
    assert all(a[1] + 1 == b[0] for a, b in zip(rows, rows[1:], strict=False))
    for lo, hi, config in rows:
        split = config["k_split"] != (2048, 768)
        assert not split or config["gate_up"]["block_m"] == 16
        assert config["gate_up"]["block_m"] < 128 or device_info.smem_kb >= 160
        for t in {lo, (lo + hi) // 2, hi}:
            assert call_config(shape, device_info, t) == config


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act_format", CASES, ids=str)
@pytest.mark.parametrize("activation,order", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("t", [1, 2, 7, 64, 1024])
def test_gpu_moe_matches_reference(rng, fmt, act_format, activation, order, t):
    inter = 192 if bf.spec(fmt).packing != "ggml" else 256  # I not a multiple of 128 where the format allows
    x, w13, w2, weights, ids = problem(rng, fmt, act_format, activation, e=8, h=512, inter=inter, t=t, top_k=2)
    kw = dict(activation=activation, w13_order=order, max_tokens=t, top_k=2, act_format=act_format)
    # the Triton MoE alone: the measured plans run the tensor-core MoE at these sizes (test_mma_moe.py tests it)
    row = alone(prepared_on_cuda(w13, w2, **kw), w13, w2).for_tokens(t)
    workspace.poison(torch.device("cuda"))  # every temporary the kernels read, they must have written first
    y = row.run(x.cuda(), weights.cuda(), ids.cuda())
    ref = bf16_weights(bc.prepare_moe(w13, w2, **kw))
    close(y.cpu(), ref(x, weights, ids), slack=quantizer_flips(x, weights, ids, ref))
    assert torch.equal(row.run(x.cuda(), weights.cuda(), ids.cuda()), y)  # deterministic


@pytest.mark.gpu
def test_gpu_moe_replays_in_cuda_graphs(rng):
    x, w13, w2, weights, ids = problem(rng, "MXFP4", "mxfp8", "silu", e=8, h=512, inter=256, t=5, top_k=2)
    p = bc.prepare_moe(w13, w2, device="cuda", max_tokens=5, top_k=2, act_format="mxfp8")
    x, weights, ids = x.cuda(), weights.cuda(), ids.cuda()
    eager = bc.moe(x, weights, ids, p)
    graph, out = capture(lambda: bc.moe(x, weights, ids, p))
    ids.copy_(ids.flip(0))  # new routing, same shapes: the graph follows it
    weights.copy_(weights.flip(0))
    x.copy_(x.flip(0))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager.flip(0))


def random_q8_0_experts(rng, e: int, n: int, k: int) -> bf.QuantizedWeight:
    """Valid Q8_0 expert blocks from random bytes (quantizing gigabytes on the host would take minutes)."""
    blocks = rng.integers(0, 256, size=(e, n, k // 32, 34), dtype=np.uint8)
    blocks[..., :2] = rng.uniform(1e-3, 1e-2, size=(e, n, k // 32)).astype(np.float16)[..., None].view(np.uint8)
    return bf.QuantizedWeight.from_tensors("Q8_0", {"weight": blocks})


@pytest.mark.gpu
@pytest.mark.parametrize("t", [3, 300])
def test_gpu_moe_addresses_expert_bytes_past_2_gib(rng, t):
    """An expert stack past 2^31 bytes (DeepSeek-V3's gate/up stack is 3.8 GB): tokens routed to the last two
    experts match the reference run on those two experts alone."""
    e, h, inter = 72, 7168, 2048  # gate/up: 72 × 4096 rows × 7616 bytes = 2.2 GB
    w13, w2 = random_q8_0_experts(rng, e, 2 * inter, h), random_q8_0_experts(rng, e, h, inter)
    assert w13.tensors["weight"].nbytes > 2**31
    x = torch.from_numpy(rng.standard_normal((t, h)).astype(np.float32)).to(torch.bfloat16)
    weights, local = bc.route_topk(torch.from_numpy(rng.standard_normal((t, 2)).astype(np.float32)), 2)
    gpu = bc.prepare_moe(w13, w2, device="cuda", max_tokens=t, top_k=2)
    y = bc.moe(x.cuda(), weights.cuda(), (local + e - 2).cuda(), gpu)
    last = [bf.QuantizedWeight.from_tensors("Q8_0", {"weight": w.tensors["weight"][-2:]}) for w in (w13, w2)]
    ref = bf16_weights(bc.prepare_moe(*last, max_tokens=t, top_k=2))
    close(y.cpu(), ref(x, weights, local))


def test_escape_hatch_turns_off_routing_kernel_and_split_k(rng, monkeypatch):
    """B12X_MOE_DECODE_KERNELS=0, read when the plan is made: torch routing ops and whole-K GEMMs in every row."""
    assert any(config["k_split"] != (2048, 768) for _, _, config in moe_plan(H200, 4)[1])
    monkeypatch.setenv("B12X_MOE_DECODE_KERNELS", "0")
    x, w13, w2, weights, ids = problem(rng, "MXFP4", "bf16", "silu", e=4, h=256, inter=128, t=3, top_k=2)
    p = alone(bc.prepare_moe(w13, w2, max_tokens=3, top_k=2), w13, w2, H200)
    assert all(row.config["route"] == "torch" and row.config["k_split"] == (256, 128) for row in p.rows)
    torch_ops = block_table_torch(ids, 128, 16)
    assert all(torch.equal(a, b) for a, b in zip(block_table(ids, 128, 16, route="torch"), torch_ops, strict=True))
