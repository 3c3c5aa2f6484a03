"""Q8_0 vocabulary embedding: rows gathered as raw blocks and decoded to bf16."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import b12x_formats as bf

from . import _registry
from . import plan as plans
from ._checks import check_tensor, refuse_during_capture, resolve_device
from .backends import DeviceInfo, Query
from .errors import UnsupportedError


@dataclass(eq=False)
class PreparedEmbedding:
    vocab: int
    hidden: int
    device: torch.device
    blocks: torch.Tensor = field(repr=False)  # uint8 [V, H/32, 34], the checkpoint bytes
    plan: plans.Plan | None = field(default=None, repr=False)
    handle: int = 0

    @property
    def path(self) -> str:
        return self.plan.summary()

    def __repr__(self) -> str:
        return f"PreparedEmbedding(Q8_0, V={self.vocab}, H={self.hidden}, {self.device}, path={self.path})"


def prepare_embedding(qw: bf.QuantizedWeight, device="cpu", path: str = "auto") -> PreparedEmbedding:
    refuse_during_capture("prepare_embedding")
    if not isinstance(qw, bf.QuantizedWeight) or qw.format != "Q8_0" or len(qw.shape) != 2:
        what = f"{qw.format} {list(qw.shape)}" if isinstance(qw, bf.QuantizedWeight) else type(qw).__name__
        raise UnsupportedError(f"embedding supports Q8_0 weights [V, H], got {what}")
    device = resolve_device(device)
    blocks = torch.from_numpy(qw.tensors["weight"].copy()).to(device)
    emb = PreparedEmbedding(qw.shape[0], qw.shape[1], device, blocks)
    query = Query("embedding", "Q8_0", "bf16", "bf16", DeviceInfo.of(device), path, qw.shape[1], 0, plans.UNBOUNDED)
    emb.plan = plans.build(query, emb)
    emb.handle = _registry.register(emb)
    return emb


def check_embedding_call(ids: torch.Tensor, emb: PreparedEmbedding) -> None:
    check_tensor("ids", ids, dtype=(torch.int32, torch.int64), device=emb.device)


def embedding(ids: torch.Tensor, emb: PreparedEmbedding) -> torch.Tensor:
    """int32/int64 ids [...] -> bf16 [..., H]; ids outside [0, V) raise ValueError."""
    check_embedding_call(ids, emb)
    return torch.ops.b12x.embedding(ids, emb.handle)


def run_embedding(ids: torch.Tensor, emb: PreparedEmbedding) -> torch.Tensor:
    if ids.numel() == 0:
        return torch.empty(*ids.shape, emb.hidden, dtype=torch.bfloat16, device=ids.device)
    return emb.plan.for_tokens(ids.numel()).run(ids).reshape(*ids.shape, emb.hidden)
