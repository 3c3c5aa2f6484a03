"""Q8_0 vocabulary embedding: rows gathered as raw blocks and decoded to bf16."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import b12x_formats as bf

from . import _registry
from ._checks import check_tensor, refuse_during_capture, resolve_device
from .dispatch import Query, choose
from .errors import UnsupportedError


@dataclass(eq=False)
class PreparedEmbedding:
    vocab: int
    hidden: int
    device: torch.device
    path: str
    blocks: torch.Tensor = field(repr=False)  # uint8 [V, H/32, 34], the checkpoint bytes
    query: Query | None = None
    handle: int = 0

    def __repr__(self) -> str:
        return f"PreparedEmbedding(Q8_0, V={self.vocab}, H={self.hidden}, {self.device}, path={self.path})"


def prepare_embedding(qw: bf.QuantizedWeight, device="cpu", path: str = "auto") -> PreparedEmbedding:
    refuse_during_capture("prepare_embedding")
    if not isinstance(qw, bf.QuantizedWeight) or qw.format != "Q8_0" or len(qw.shape) != 2:
        what = f"{qw.format} {list(qw.shape)}" if isinstance(qw, bf.QuantizedWeight) else type(qw).__name__
        raise UnsupportedError(f"embedding supports Q8_0 weights [V, H], got {what}")
    device = resolve_device(device)
    query = Query("embedding", "Q8_0", "bf16", device, path)
    chosen = choose(query)
    blocks = torch.from_numpy(qw.tensors["weight"].copy()).to(device)
    emb = PreparedEmbedding(qw.shape[0], qw.shape[1], device, chosen, blocks)
    emb.query, emb.handle = query, _registry.register(emb)
    return emb


def embedding(ids: torch.Tensor, emb: PreparedEmbedding) -> torch.Tensor:
    """int32/int64 ids [...] -> bf16 [..., H]; ids outside [0, V) raise ValueError."""
    check_tensor("ids", ids, dtype=(torch.int32, torch.int64), device=emb.device)
    return torch.ops.b12x.embedding(ids, emb.handle)


def embedding_reference(ids: torch.Tensor, emb: PreparedEmbedding) -> torch.Tensor:
    flat = ids.reshape(-1).to(torch.int64)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= emb.vocab):
        raise ValueError(f"embedding ids must lie in [0, {emb.vocab}), got [{int(flat.min())}, {int(flat.max())}]")
    rows = emb.blocks[flat]  # [T, H/32, 34]
    d = rows[..., :2].contiguous().view(torch.float16).to(torch.float32)  # [T, H/32, 1]
    q = rows[..., 2:].contiguous().view(torch.int8).to(torch.float32)
    return (d * q).reshape(*ids.shape, emb.hidden).to(torch.bfloat16)
