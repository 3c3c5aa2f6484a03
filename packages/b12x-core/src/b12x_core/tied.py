"""Tied word embeddings: the LM head as a linear layer over the bytes a prepared embedding already holds.

A model whose `lm_head` is tied to `embed_tokens` reads one [V, H] matrix twice: as rows (the embedding) and
as a [N=V, K=H] linear (the head). `prepare_tied_linear` builds the head's plan over a `DeviceWeights` whose
stacked checkpoint bytes (what the GEMV, the Triton tiles and dequantize + GEMM read) are the embedding's own
tensor, so the device keeps one copy of the quantized weight. The query says so (`shares_bytes`): backends that
would make their own layout of the weight (the tensor-core GEMM's repack) decline, and explain says why. The swap
happens only after checking that the bytes are identical, so a layout change in `weights.stack` shows up as an
error here instead of a head computing with the wrong matrix. On CPU the head runs the exact reference over its
float32 dequantization, as every reference linear does.
"""

from __future__ import annotations

import torch

import b12x_formats as bf

from . import _registry
from . import plan as plans
from ._checks import check_positive, refuse_during_capture
from .backends import DeviceInfo, Query
from .embedding import PreparedEmbedding
from .errors import UnsupportedError
from .linear import DEFAULT_MAX_TOKENS, PreparedLinear
from .weights import DeviceWeights


def prepare_tied_linear(emb: PreparedEmbedding, max_tokens: int = DEFAULT_MAX_TOKENS) -> PreparedLinear:
    """A `PreparedLinear` (bf16 activations, N = vocab, K = hidden) sharing `emb`'s quantized bytes."""
    refuse_during_capture("prepare_tied_linear")
    if not isinstance(emb, PreparedEmbedding):
        raise UnsupportedError(f"prepare_tied_linear takes a PreparedEmbedding, got {type(emb).__name__}")
    check_positive("max_tokens", max_tokens)
    # The host copy only lives during prepare; from_tensors validates the blocks as it would a checkpoint's.
    qw = bf.QuantizedWeight.from_tensors("Q8_0", {"weight": emb.blocks.cpu().numpy()})
    path = emb.plan.query.path if emb.plan is not None else "auto"  # a reference embedding gets a reference head
    query = Query("linear", "Q8_0", "bf16", "bf16", DeviceInfo.of(emb.device), path, emb.vocab, emb.hidden,
                  max_tokens, (emb.vocab,), shares_bytes=True)  # fmt: skip
    weights = DeviceWeights([qw], "bf16", None, emb.device)
    if emb.device.type == "cuda":
        weights.stacked.weight = _shared(weights.stacked.weight, emb.blocks, "stacked weight")
    lin = PreparedLinear("Q8_0", "bf16", "bf16", emb.vocab, emb.hidden, max_tokens, emb.device, None,
                         plans.build(query, weights))  # fmt: skip
    lin.handle = _registry.register(lin)
    return lin


@torch.no_grad()
def _shared(own: torch.Tensor, source: torch.Tensor, what: str) -> torch.Tensor:
    """`source` viewed with `own`'s shape, after checking both hold the same bytes."""
    same = own.dtype == source.dtype and own.numel() == source.numel() and own.device == source.device
    if not same or not torch.equal(own.reshape(-1), source.reshape(-1)):
        raise UnsupportedError(
            f"tied LM head: the prepared linear's {what} {own.dtype}{list(own.shape)} is not a plain copy of the "
            f"embedding's blocks {source.dtype}{list(source.shape)}; cannot share them"
        )
    return source.view(own.shape)
