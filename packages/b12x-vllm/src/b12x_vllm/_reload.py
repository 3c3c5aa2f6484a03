"""Weight re-loading (RL weight sync, `llm.collective_rpc("reload_weights")`) keeps the prepared tensors'
addresses, so CUDA graphs captured before the reload replay on the new weights.

A prepared b12x op is a tree of objects (its plan, the plan's prepared backends, their device layouts); this
walks two such trees side by side without knowing their classes: when both hold the same tensors in the same
places (shapes, dtypes, strides), the new tensors are copied into the old ones and every other value is taken
from the new tree (scales kept on the host follow the new weights); otherwise the new object replaces the old.
"""

from __future__ import annotations

import dataclasses

import torch

_IDENTITY = ("handle",)  # the old object's registration stays valid


def keep_addresses(old, new):
    """`new` when there is nothing to keep or the layout changed; otherwise `old`, with every tensor of `new`
    copied into it in place and every other value taken from `new`."""
    if old is None or type(old) is not type(new) or _layout(old) != _layout(new):
        return new
    _copy_into(old, new, set())
    return old


def _children(obj) -> list[tuple[str, object]] | None:
    """(name, value) of a container's parts, or None for a leaf (tensors, host values, classes)."""
    if isinstance(obj, (list, tuple)):
        return list(enumerate(obj))
    if isinstance(obj, dict):
        return list(obj.items())
    if isinstance(obj, (type, torch.device, torch.Tensor)) or not hasattr(obj, "__dict__"):
        return None
    if dataclasses.is_dataclass(obj):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    return list(vars(obj).items())


def _holds_tensors(obj, seen: set) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    parts = _children(obj)
    if parts is None or id(obj) in seen:
        return False
    seen.add(id(obj))
    return any(_holds_tensors(value, seen) for _, value in parts)


def _layout(obj, seen=None, path="") -> list:
    """Every tensor under obj as (path, shape, dtype, stride, device), in walk order."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        return [(path, tuple(obj.shape), obj.dtype, obj.stride(), obj.device)]
    parts = _children(obj)
    if parts is None or id(obj) in seen:
        return []
    seen.add(id(obj))
    return [t for name, value in parts if name not in _IDENTITY for t in _layout(value, seen, f"{path}/{name}")]


@torch.no_grad()
def _copy_into(old, new, seen: set) -> None:
    if isinstance(old, torch.Tensor):
        old.copy_(new)
        return
    parts = _children(old)
    if parts is None or id(old) in seen:
        return
    seen.add(id(old))
    new_parts = dict(_children(new))
    for name, value in parts:
        if name in _IDENTITY:
            continue
        if _holds_tensors(value, set()):
            _copy_into(value, new_parts[name], seen)
        elif not isinstance(old, (list, tuple)):
            if isinstance(old, dict):
                old[name] = new_parts[name]
            else:
                object.__setattr__(old, name, new_parts[name])  # frozen dataclasses too: host values only
