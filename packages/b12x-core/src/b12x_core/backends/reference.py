"""The exact reference of every op: the weight dequantized exactly by b12x_formats, activations quantized as the
kernels quantize them (b12x_core.activations), float32 arithmetic, one bf16 rounding. It runs wherever torch
runs, but on CUDA only when asked for (`path="reference"`): b12x never silently falls back to a slow path."""

from __future__ import annotations

import torch

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
        from ..moe import moe_reference

        return moe_reference(x, topk_weights, topk_ids, self.query, self.w13, self.w2, self.input_scales)


class ReferenceEmbedding(_Reference):
    op = "embedding"

    def run(self, ids, *, config):
        from ..embedding import embedding_reference

        return embedding_reference(ids, self.weights)
