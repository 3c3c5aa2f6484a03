"""Tied word embeddings: the LM head as a linear layer over the bytes a prepared embedding already holds.

A model whose `lm_head` is tied to `embed_tokens` reads one [V, H] matrix twice: as rows (the embedding) and
as a [N=V, K=H] linear (the head). `prepare_tied_linear` prepares that linear through `prepare_linear`, so it
runs whatever path dispatch picks for the format, then points every tensor that holds the raw checkpoint
bytes (the GEMV's blocks, the tiles' weight) at the embedding's own tensor: the device keeps one copy of
the quantized weight. The swap happens only after checking that the bytes are identical, so a layout change
in prepare_linear shows up as an error here instead of a head computing with the wrong matrix.
On CPU the linear runs the exact reference, whose float32 decode of the matrix is what the reference
computes with for every linear; the quantized bytes are not duplicated there either.
"""

from __future__ import annotations

import torch

import b12x_formats as bf

from .embedding import PreparedEmbedding
from .errors import UnsupportedError
from .linear import DEFAULT_MAX_TOKENS, PreparedLinear, prepare_linear


def prepare_tied_linear(emb: PreparedEmbedding, max_tokens: int = DEFAULT_MAX_TOKENS) -> PreparedLinear:
    """A `PreparedLinear` (bf16 activations, N = vocab, K = hidden) sharing `emb`'s quantized bytes."""
    if not isinstance(emb, PreparedEmbedding):
        raise UnsupportedError(f"prepare_tied_linear takes a PreparedEmbedding, got {type(emb).__name__}")
    # The host copy only lives during prepare; prepare_linear validates the blocks as it would a checkpoint's.
    qw = bf.QuantizedWeight.from_tensors("Q8_0", {"weight": emb.blocks.cpu().numpy()})
    path = emb.query.path if emb.query is not None else "auto"  # a reference embedding gets a reference head
    lin = prepare_linear(qw, device=emb.device, max_tokens=max_tokens, activation="bf16", path=path)
    if lin.blocks is not None:
        lin.blocks = _shared(lin.blocks, emb.blocks, "blocks")
    if lin.tiles is not None:
        lin.tiles.weight = _shared(lin.tiles.weight, emb.blocks, "tiles.weight")
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
