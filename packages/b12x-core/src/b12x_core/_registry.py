"""Prepared objects by integer handle: custom ops take the handle (a graph constant), not the object."""

from __future__ import annotations

import itertools
import weakref

_objects: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_next = itertools.count(1)


def register(obj) -> int:
    handle = next(_next)
    _objects[handle] = obj
    return handle


def lookup(handle: int):
    try:
        return _objects[handle]
    except KeyError:
        raise ValueError(f"b12x: prepared object {handle} no longer exists (keep the prepare_* result alive)") from None
