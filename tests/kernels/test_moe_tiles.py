"""The fused-MoE Triton path (b12x_core.moe_path: expert-sorted slots, grouped GEMMs with the activation fused,
deterministic combine) against the b12x-core reference, every MoE format × activation format × activation.

On CPU the kernels run in Triton's interpreter (conftest.py), fed directly; on the GPU (marked gpu) through
bc.prepare_moe / bc.moe at T ∈ {1, 2, 7, 64, 1024}. Tolerance as the linear tiles (closeness.py), against the
reference run on the weights the kernels multiply: decoded and rounded to bf16 (exact for the FP4 formats; one
rounding of d·q for Q8_0 and IQ2, which two chained GEMMs would otherwise amplify past 1e-2).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from closeness import close
from graphs import capture

import b12x_core as bc
import b12x_formats as bf

pytest.importorskip("triton")

from b12x_core import moe_path, scratch, tile_path  # noqa: E402
from b12x_core.activations import quantize_activation  # noqa: E402
from b12x_core.moe import MOE_FORMATS, _expert_activation, moe_reference  # noqa: E402

CASES = [(fmt, act) for fmt, acts in MOE_FORMATS.items() for act in acts]
ACTIVATIONS = [("silu", "gate_up"), ("silu", "up_gate"), ("relu2", "gate_up")]


def experts(rng, fmt, e, n, k, input_scale=None):
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


def bf16_weights(p):
    """The reference on the kernels' operands: GGML weights rounded to bf16 as the kernels decode them (the
    other formats decode exactly; their per-tensor factors apply in float32 after the dot)."""
    if bf.spec(p.w13_format).packing != "ggml":
        return p
    return dataclasses.replace(p, w13=p.w13.to(torch.bfloat16).float(), w2=p.w2.to(torch.bfloat16).float())


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
        a32 = _expert_activation(xq[tokens] @ p.w13[e].T, p)
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
    order, expert, start, rows = moe_path.block_table(ids, experts=5, rows_per_block=2)
    assert expert.numel() == -(-10 // 2) + 5  # a fixed launch whatever the routing
    covered = []
    for b in range(expert.numel()):
        if expert[b] < 0:
            continue
        for i in range(int(rows[b])):
            slot = int(order[int(start[b]) + i])
            assert int(ids.reshape(-1)[slot]) == int(expert[b])
            covered.append(slot)
    assert sorted(covered) == list(range(10))


@pytest.mark.parametrize("tokens,top_k,experts,rows_per_block", [(1, 8, 128, 16), (7, 2, 5, 16), (64, 8, 256, 16),
                                                                  (128, 8, 60, 64), (1, 1, 1, 16)])  # fmt: skip
def test_routing_kernel_matches_torch_tables(rng, tokens, top_k, experts, rows_per_block):
    """The one-launch routing tables (b12x_kernels.moe_route) equal the torch ops' on every block with work."""
    logits = torch.from_numpy(rng.standard_normal((tokens, experts)).astype(np.float32))
    ids = bc.route_topk(logits, top_k)[1]
    if rng.random() < 0.5:  # crowd the low experts: several blocks for one expert
        ids = ids % max(1, experts // 8)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fused = [t.cpu() for t in moe_path.block_table(ids.to(device), experts, rows_per_block)]
    ref = moe_path.block_table_torch(ids, experts, rows_per_block)
    assert torch.equal(fused[0], ref[0]) and torch.equal(fused[1], ref[1])
    work = ref[1] >= 0
    assert torch.equal(fused[2][work], ref[2][work]) and torch.equal(fused[3][work], ref[3][work])


def interpreted(rng, fmt, act_format, activation, order, t):
    """moe_path.moe_tiles in Triton's interpreter against the reference (tolerance: closeness.py + flips)."""
    inter = 256 if bf.spec(fmt).packing == "ggml" else 96  # w2's K is I: IQ2 needs whole 256-blocks
    x, w13, w2, weights, ids = problem(rng, fmt, act_format, activation, e=4, h=256, inter=inter, t=t, top_k=2)
    ref = bc.prepare_moe(w13, w2, activation=activation, w13_order=order, max_tokens=t, top_k=2, act_format=act_format)
    p = dataclasses.replace(
        ref,
        tiles13=tile_path.prepare_tiles([w13], ref.act_mode_13, ref.input_scale_13, "cpu"),
        tiles2=tile_path.prepare_tiles([w2], ref.act_mode_2, ref.input_scale_2, "cpu"),
    )
    moe_path.reserve_scratch(p)
    scratch.poison(p.device)
    ref = bf16_weights(ref)
    close(moe_path.moe_tiles(x, weights, ids, p), moe_reference(x, weights, ids, ref),
          slack=quantizer_flips(x, weights, ids, ref))  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests below run the compiled kernels")
@pytest.mark.parametrize("fmt,act_format", CASES, ids=str)
@pytest.mark.parametrize("activation,order", ACTIVATIONS, ids=str)
def test_interpreted_moe_matches_reference(rng, fmt, act_format, activation, order):
    interpreted(rng, fmt, act_format, activation, order, t=7)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests below run the compiled kernels")
@pytest.mark.parametrize("t", [40, 160])  # 20 and 80 rows per expert: 64- and 128-row blocks
@pytest.mark.parametrize("fmt,act_format,activation,order", [("MXFP4", "mxfp8", "silu", "up_gate"),
                                                             ("Q8_0", "bf16", "relu2", "gate_up")])  # fmt: skip
def test_interpreted_moe_prefill_configurations(rng, monkeypatch, fmt, act_format, activation, order, t):
    monkeypatch.setattr(moe_path, "_smem_kb", lambda device: 228)  # the H200's budget: 128-row blocks allowed
    interpreted(rng, fmt, act_format, activation, order, t)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests below run the compiled kernels")
@pytest.mark.parametrize("fmt,act_format,activation,order", [("NVFP4", "nvfp4", "silu", "up_gate"),
                                                             ("IQ2_XXS", "bf16", "relu2", "gate_up")])  # fmt: skip
def test_interpreted_moe_splits_k(rng, monkeypatch, fmt, act_format, activation, order):
    """Both GEMMs split along K (as many SMs as make each split one step), the splits added in order."""
    monkeypatch.setattr(moe_path, "_sms", lambda device: 64)
    p = SimpleNamespace(top_k=2, experts=4, hidden=256, intermediate=256, activation=activation, device=torch.device("cpu"),
                        max_tokens=3)  # fmt: skip
    assert moe_path.splits(p, 3) == (128, 2, 128, 2)
    interpreted(rng, fmt, act_format, activation, order, t=3)


def test_warm_compiles_every_configuration_a_call_can_pick(monkeypatch):
    monkeypatch.setattr(moe_path, "_sms", lambda device: 132)  # the H200's: decode-sized calls split K
    for smem in (99, 228):
        monkeypatch.setattr(moe_path, "_smem_kb", lambda device, smem=smem: smem)
        p = SimpleNamespace(max_tokens=3000, top_k=8, experts=128, activation="silu", device=torch.device("cpu"),
                            hidden=2048, intermediate=768)  # fmt: skip
        called = []
        monkeypatch.setattr(moe_path, "moe_tiles", lambda x, w, ids, p, called=called: called.append(x.shape[0]))
        monkeypatch.setattr(moe_path, "reserve_scratch", lambda p: None)
        moe_path.warm(p)

        def kernels(t, p=p):
            return str(moe_path.configs(p, t)), moe_path.splits(p, t)[1] > 1

        warmed = {kernels(t) for t in called}
        assert len({c for c, _ in warmed}) == (3 if smem == 228 else 2) and {s for _, s in warmed} == {True, False}
        assert all(kernels(t) in warmed for t in range(1, p.max_tokens + 1))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act_format", CASES, ids=str)
@pytest.mark.parametrize("activation,order", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("t", [1, 2, 7, 64, 1024])
def test_gpu_moe_matches_reference(rng, fmt, act_format, activation, order, t):
    inter = 192 if bf.spec(fmt).packing != "ggml" else 256  # I not a multiple of 128 where the format allows
    x, w13, w2, weights, ids = problem(rng, fmt, act_format, activation, e=8, h=512, inter=inter, t=t, top_k=2)
    kw = dict(activation=activation, w13_order=order, max_tokens=t, top_k=2, act_format=act_format)
    gpu = bc.prepare_moe(w13, w2, device="cuda", **kw)
    assert gpu.path == "triton_moe"
    scratch.poison(gpu.device)  # every temporary the kernels read, they must have written first
    y = bc.moe(x.cuda(), weights.cuda(), ids.cuda(), gpu)
    ref = bf16_weights(bc.prepare_moe(w13, w2, **kw))
    close(y.cpu(), moe_reference(x, weights, ids, ref), slack=quantizer_flips(x, weights, ids, ref))
    assert torch.equal(bc.moe(x.cuda(), weights.cuda(), ids.cuda(), gpu), y)  # deterministic


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
    close(y.cpu(), moe_reference(x, weights, local, ref))


def test_escape_hatch_turns_off_routing_kernel_and_split_k(rng, monkeypatch):
    monkeypatch.setattr(moe_path, "_sms", lambda device: 132)
    p = SimpleNamespace(top_k=8, experts=128, hidden=2048, intermediate=768, activation="silu",
                        device=torch.device("cpu"), max_tokens=4)  # fmt: skip
    assert moe_path.splits(p, 1)[1] > 1
    monkeypatch.setenv("B12X_MOE_DECODE_KERNELS", "0")
    assert moe_path.splits(p, 1) == (2048, 1, 768, 1)
    ids = bc.route_topk(torch.from_numpy(rng.standard_normal((3, 128)).astype(np.float32)), 8)[1]
    torch_ops = moe_path.block_table_torch(ids, 128, 16)
    assert all(torch.equal(a, b) for a, b in zip(moe_path.block_table(ids, 128, 16), torch_ops, strict=True))
