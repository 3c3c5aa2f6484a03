"""torch.ops.b12x.*: custom ops with fake (meta) implementations, so torch.compile(fullgraph=True) traces
through them. Prepared state is passed as an integer handle (a graph constant). Each op checks its arguments as
the Python function does (also when traced), then runs its prepared op's plan row for the call's token count."""

from __future__ import annotations

import torch

from . import _registry
from .embedding import check_embedding_call, run_embedding
from .linear import check_linear_call, run_linear
from .moe import check_moe_call, run_moe, run_route_topk


@torch.library.custom_op("b12x::linear", mutates_args=())
def _linear(x: torch.Tensor, handle: int, bias: torch.Tensor | None) -> torch.Tensor:
    lin = _registry.lookup(handle)
    check_linear_call(x, lin, bias)
    return run_linear(x, lin, bias)


@_linear.register_fake
def _(x, handle, bias):
    lin = _registry.lookup(handle)
    check_linear_call(x, lin, bias)
    return x.new_empty(*x.shape[:-1], lin.n, dtype=torch.bfloat16)


@torch.library.custom_op("b12x::moe", mutates_args=())
def _moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, handle: int) -> torch.Tensor:
    p = _registry.lookup(handle)
    check_moe_call(x, topk_weights, topk_ids, p)
    return run_moe(x, topk_weights, topk_ids, p)


@_moe.register_fake
def _(x, topk_weights, topk_ids, handle):
    check_moe_call(x, topk_weights, topk_ids, _registry.lookup(handle))
    return torch.empty_like(x)


@torch.library.custom_op("b12x::embedding", mutates_args=())
def _embedding(ids: torch.Tensor, handle: int) -> torch.Tensor:
    emb = _registry.lookup(handle)
    check_embedding_call(ids, emb)
    return run_embedding(ids, emb)


@_embedding.register_fake
def _(ids, handle):
    emb = _registry.lookup(handle)
    check_embedding_call(ids, emb)
    return ids.new_empty(*ids.shape, emb.hidden, dtype=torch.bfloat16)


@torch.library.custom_op("b12x::route_topk", mutates_args=())
def _route_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return run_route_topk(router_logits, top_k, renormalize)


@_route_topk.register_fake
def _(router_logits, top_k, renormalize):
    t = router_logits.shape[0]
    return router_logits.new_empty(t, top_k, dtype=torch.float32), router_logits.new_empty(t, top_k, dtype=torch.int32)
