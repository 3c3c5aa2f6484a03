"""What a plan holds in memory: every tensor its prepared backends reach, each storage counted once."""

from __future__ import annotations

import torch


def held_bytes(rows) -> int:
    """Bytes of memory the plan's prepared backends hold (their weights in every layout kept, each storage
    once: layouts shared between backends or with a tied embedding count once; the per-device scratch that
    every op shares does not count). 0 for a preview (no weights)."""
    storages = {}
    for backend in {id(row.backend): row.backend for row in rows}.values():
        for t in tensors(vars(backend), set()):
            storage = t.untyped_storage()
            storages[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def tensors(obj, seen: set):
    """Every torch tensor reachable from obj through containers and the attributes of b12x objects."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors(v, seen)
    elif type(obj).__module__.startswith("b12x_core") and hasattr(obj, "__dict__"):
        yield from tensors(vars(obj), seen)
