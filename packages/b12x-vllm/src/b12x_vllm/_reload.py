"""Weight re-loading (RL weight sync, `llm.collective_rpc("reload_weights")`) keeps the prepared tensors'
addresses, so CUDA graphs captured before the reload replay on the new weights."""

from __future__ import annotations

import dataclasses

import torch

_IDENTITY = ("handle", "query")  # the old object's registration stays valid


def keep_addresses(old, new):
    """`new` when there is nothing to keep or the layout changed; otherwise `old`, with every tensor of `new`
    copied into it in place and every other field taken from `new`."""
    if old is None or not dataclasses.is_dataclass(new) or not _same_layout(old, new):
        return new
    _copy_into(old, new)
    return old


def _same_layout(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and a.stride() == b.stride()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_layout(x, y) for x, y in zip(a, b, strict=True))
    if dataclasses.is_dataclass(a):
        return all(_same_layout(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
                   if f.name not in _IDENTITY and _holds_tensors(getattr(a, f.name)))  # fmt: skip
    return True


def _holds_tensors(value) -> bool:
    return isinstance(value, (torch.Tensor, list, tuple)) or dataclasses.is_dataclass(value)


@torch.no_grad()
def _copy_into(old, new) -> None:
    if isinstance(old, torch.Tensor):
        old.copy_(new)
    elif isinstance(old, (list, tuple)):
        for x, y in zip(old, new, strict=True):
            _copy_into(x, y)
    elif dataclasses.is_dataclass(old):
        for f in dataclasses.fields(old):
            value = getattr(new, f.name)
            if f.name in _IDENTITY:
                continue
            if _holds_tensors(value):
                _copy_into(getattr(old, f.name), value)
            else:
                setattr(old, f.name, value)
