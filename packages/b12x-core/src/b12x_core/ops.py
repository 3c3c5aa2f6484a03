"""torch.ops.b12x.*: custom ops with fake (meta) implementations, so torch.compile(fullgraph=True) traces
through them. Prepared state is passed as an integer handle (a graph constant)."""

from __future__ import annotations

import torch

from . import _registry, cuda_paths, tile_path
from .embedding import embedding_reference
from .linear import linear_reference
from .moe import moe_reference, route_topk_reference


@torch.library.custom_op("b12x::linear", mutates_args=())
def _linear(x: torch.Tensor, handle: int, bias: torch.Tensor | None) -> torch.Tensor:
    lin = _registry.lookup(handle)
    if lin.tiles is not None and x.numel() // lin.k >= lin.tiles_from:
        return tile_path.linear_tiles(x, lin, bias)
    if lin.path == "cuda_gemv_ggml":
        return cuda_paths.linear_ggml(x, lin, bias)
    if lin.path == "cuda_gemv_elem":
        return cuda_paths.linear_element(x, lin, bias)
    return linear_reference(x, lin, bias)


@_linear.register_fake
def _(x, handle, bias):
    lin = _registry.lookup(handle)
    return x.new_empty(*x.shape[:-1], lin.n, dtype=torch.bfloat16)


@torch.library.custom_op("b12x::moe", mutates_args=())
def _moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, handle: int) -> torch.Tensor:
    p = _registry.lookup(handle)
    if p.path == "triton_moe":
        from . import moe_path

        return moe_path.moe_tiles(x, topk_weights, topk_ids, p)
    return moe_reference(x, topk_weights, topk_ids, p)


@_moe.register_fake
def _(x, topk_weights, topk_ids, handle):
    return torch.empty_like(x)


@torch.library.custom_op("b12x::embedding", mutates_args=())
def _embedding(ids: torch.Tensor, handle: int) -> torch.Tensor:
    emb = _registry.lookup(handle)
    if emb.path == "cuda_embedding_q8_0":
        return cuda_paths.embedding_q8_0(ids, emb)
    return embedding_reference(ids, emb)


@_embedding.register_fake
def _(ids, handle):
    emb = _registry.lookup(handle)
    return ids.new_empty(*ids.shape, emb.hidden, dtype=torch.bfloat16)


@torch.library.custom_op("b12x::route_topk", mutates_args=())
def _route_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return route_topk_reference(router_logits, top_k, renormalize)


@_route_topk.register_fake
def _(router_logits, top_k, renormalize):
    t = router_logits.shape[0]
    return router_logits.new_empty(t, top_k, dtype=torch.float32), router_logits.new_empty(t, top_k, dtype=torch.int32)
