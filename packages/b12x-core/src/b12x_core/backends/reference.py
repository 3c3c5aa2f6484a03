"""The exact reference of every op: the weight dequantized exactly by b12x_formats, activations quantized as the
kernels quantize them (b12x_core.activations), float32 arithmetic, one bf16 rounding. It runs wherever torch
runs, but on CUDA only when asked for (`path="reference"`): b12x never silently falls back to a slow path.

The math lives here, beside its backend, and imports no op module (moe.py, embedding.py): those import the
backends, so the reference reaching back into them made an import circle."""

from __future__ import annotations

import torch

from b12x_formats.kernel_facts import Q8_0_QS_OFFSET

from ..activations import quantize_activation
from .base import Backend, Query


def _reference_reason(query: Query) -> tuple[bool, str]:
    if not query.on_cuda:
        return True, "exact reference (dequantize, float32 matmul, one bf16 rounding)"
    if query.path == "reference":
        return True, "exact reference, requested with path='reference'"
    return False, f"the reference runs on {query.device.device.type} only when asked for with path='reference'"


class _Reference(Backend):
    name, warm = "reference", False  # nothing to compile
    reads = ("dequantized",)

    @classmethod
    def can_implement(cls, query):
        return _reference_reason(query)


class ReferenceLinear(_Reference):
    op = "linear"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.weight = weights.dequantized  # float32 [N, K]

    def run(self, x2, bias, *, config):
        y = quantize_activation(x2, self.query.act_mode, self.weights.input_scale) @ self.weight.T
        if bias is not None:
            y = y + bias.to(torch.float32)
        return y.to(torch.bfloat16)


class ReferenceMoE(_Reference):
    op = "moe"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        w13, w2 = weights
        self.w13, self.w2 = w13.dequantized, w2.dequantized  # float32 [E, 2I or I, H], [E, H, I]
        self.input_scales = (w13.input_scale, w2.input_scale)

    def run(self, x, topk_weights, topk_ids, *, config):
        return moe_reference(x, topk_weights, topk_ids, self.query, self.w13, self.w2, self.input_scales)


class ReferenceEmbedding(_Reference):
    op = "embedding"

    def run(self, ids, *, config):
        return embedding_reference(ids, self.weights)


def expert_activation(h: torch.Tensor, shape) -> torch.Tensor:
    """silu(gate) · up (halves in `shape.w13_order`) or relu(h)²; `shape`: a MoEShape or PreparedMoE."""
    if shape.activation == "relu2":
        return torch.relu(h).square()
    first, second = h[:, : shape.intermediate], h[:, shape.intermediate :]
    gate, up = (first, second) if shape.w13_order == "gate_up" else (second, first)
    return torch.nn.functional.silu(gate) * up


def moe_reference(x, topk_weights, topk_ids, query, w13, w2, input_scales) -> torch.Tensor:
    """The exact reference: w13 / w2 float32 [E, ...] dequantized weights, `query` the op's (modes, shape)."""
    shape = query.moe
    ids = topk_ids.to(torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= shape.experts):
        raise ValueError(f"topk_ids must lie in [0, {shape.experts}), got [{int(ids.min())}, {int(ids.max())}]")
    xq = quantize_activation(x, query.act_mode, input_scales[0])
    y = torch.zeros(x.shape[0], shape.hidden, dtype=torch.float32, device=x.device)
    for e in range(shape.experts):  # ascending expert order: a fixed summation order, so bit-reproducible
        tokens, slots = (ids == e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        h = xq[tokens] @ w13[e].T
        a = expert_activation(h, shape).to(torch.bfloat16)
        out = quantize_activation(a, shape.act_mode_2, input_scales[1]) @ w2[e].T
        y.index_add_(0, tokens, out * topk_weights[tokens, slots, None])
    return y.to(torch.bfloat16)


def embedding_reference(ids: torch.Tensor, emb) -> torch.Tensor:
    """`emb`: a PreparedEmbedding (its raw Q8_0 blocks, vocab and hidden size)."""
    flat = ids.reshape(-1).to(torch.int64)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= emb.vocab):
        raise ValueError(f"embedding ids must lie in [0, {emb.vocab}), got [{int(flat.min())}, {int(flat.max())}]")
    rows = emb.blocks[flat]  # [T, H/group, block bytes]
    d = rows[..., :Q8_0_QS_OFFSET].contiguous().view(torch.float16).to(torch.float32)  # [T, H/group, 1]
    q = rows[..., Q8_0_QS_OFFSET:].contiguous().view(torch.int8).to(torch.float32)
    return (d * q).reshape(flat.numel(), emb.hidden).to(torch.bfloat16)
