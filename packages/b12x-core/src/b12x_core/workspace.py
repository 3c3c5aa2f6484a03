"""The buffer pools every prepared op shares, sized by prepare_* (calls allocate only their outputs):

- scratch: a call's temporaries (quantized activations, MoE slot tables and intermediates, split-K partials),
  carved into views by each call;
- the bf16 weight workspace: where the dequantize + dense GEMM backend dequantizes a weight before its GEMM, as large as
  the largest layer that uses it;
- tickets: int32 counters that split-K kernels take and reset (zero at rest), as many as the largest grid needs.

prepare_* records how large each pool must be on a device (`reserve_*`). The buffers themselves are one set per
(device, stream): calls on one stream run one after another and can share temporaries, but calls on two streams
(vLLM's shared-expert stream, overlapped micro-batches, two branches of one captured CUDA graph) may run at once
and must not. A stream's set is made on the first call that runs on it (the stream prepare ran on gets it at
prepare time); a CUDA graph capture runs on a stream of its own, so its set is made once while capturing (the
allocation is legal there: it comes from the graph's memory pool, and the tickets' zeroing becomes a node that
runs before the captured kernels at every replay).

A call that needs no temporary (bf16 activations, no K split) gets empty views and never needs a pool.
Outgrown buffers stay alive: a CUDA graph captured earlier may still read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .errors import UnsupportedError

_ALIGN = 256


@dataclass
class _Pools:
    """One stream's buffers on one device; each list ends with the buffer in use (earlier ones kept alive)."""

    scratch: list[torch.Tensor] = field(default_factory=list)
    weights: list[torch.Tensor] = field(default_factory=list)
    tickets: list[torch.Tensor] = field(default_factory=list)
    tickets_zeroed: bool = True  # False while a set made during a graph capture has not been zeroed eagerly


_required: dict[torch.device, dict[str, int]] = {}  # per device: scratch bytes, weight elements, tickets
_pools: dict[tuple[torch.device, int], _Pools] = {}


def _device(device: torch.device) -> torch.device:
    """One key per device: "cuda" (a query built without an index) and "cuda:0" name the same pools."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _stream_key(device: torch.device) -> int:
    """The stream a call on `device` is issued to (CPU: one stream)."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _pools_for(device: torch.device) -> _Pools:
    """The current stream's pools of a device already keyed by _device."""
    key = (device, _stream_key(device))
    pools = _pools.get(key)
    if pools is None:
        pools = _pools[key] = _Pools()
    return pools


def _ensure(device: torch.device, kind: str) -> torch.Tensor | None:
    """The current stream's buffer of `kind`, grown to the device's reserved size (None: nothing reserved)."""
    device = _device(device)
    size = _required.get(device, {}).get(kind)
    if size is None:
        return None
    pools = _pools_for(device)
    held = getattr(pools, kind)
    if not held or held[-1].numel() < size:
        if kind == "tickets":
            held.append(torch.zeros(size, dtype=torch.int32, device=device))
            pools.tickets_zeroed = not _capturing(device)  # under capture the zeroing runs at replay only
        else:
            held.append(torch.empty(size, dtype=torch.uint8 if kind == "scratch" else torch.bfloat16, device=device))
    elif kind == "tickets" and not pools.tickets_zeroed and not _capturing(device):
        held[-1].zero_()  # a set made while capturing, used eagerly before any replay zeroed it
        pools.tickets_zeroed = True
    return held[-1]


def _reserve(device: torch.device, kind: str, size: int) -> None:
    need = _required.setdefault(_device(device), {})
    need[kind] = max(need.get(kind, 0), size)
    _ensure(device, kind)  # the preparing stream's buffers now, not at its first call


def nbytes(specs) -> int:
    """Bytes `carve(specs)` needs: specs are (shape, dtype) pairs."""
    total = 0
    for shape, dtype in specs:
        total = -(-total // _ALIGN) * _ALIGN + math.prod(shape) * dtype.itemsize
    return total


def reserve_scratch(device: torch.device, size: int) -> None:
    """Grow the device's scratch to `size` bytes (prepare time)."""
    _reserve(device, "scratch", size)


def carve(device: torch.device, specs) -> list[torch.Tensor]:
    """Disjoint tensors of the given (shape, dtype) from the current stream's scratch (contents undefined)."""
    need = nbytes(specs)
    if need == 0:  # nothing to hold: no pool needed (a layer of bf16 activations without K splits)
        return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]
    buf = _ensure(device, "scratch")
    if buf is None or buf.numel() < need:
        have = 0 if buf is None else buf.numel()
        raise UnsupportedError(f"b12x scratch on {device} holds {have} bytes, this call needs {need}: "
                               "the call exceeds the max_tokens its op was prepared for")  # fmt: skip
    out, offset = [], 0
    for shape, dtype in specs:
        offset = -(-offset // _ALIGN) * _ALIGN
        size = math.prod(shape) * dtype.itemsize
        out.append(buf[offset : offset + size].view(dtype).view(shape))
        offset += size
    return out


def reserve_weights(device: torch.device, numel: int) -> None:
    """Grow the device's bf16 weight workspace to `numel` elements (prepare time)."""
    _reserve(device, "weights", numel)


def weights(device: torch.device, n: int, k: int) -> torch.Tensor:
    """The current stream's bf16 weight workspace as an [n, k] view (contents undefined)."""
    buf = _ensure(device, "weights")
    if buf is None or buf.numel() < n * k:
        raise UnsupportedError(f"b12x bf16 weight workspace on {device} is smaller than [{n}, {k}]: it is sized by "
                               "prepare_linear for the layers that dequantize into it")  # fmt: skip
    return buf[: n * k].view(n, k)


def reserve_tickets(device: torch.device, count: int) -> None:
    """Grow the device's zeroed split-K tickets to `count` counters (prepare time)."""
    _reserve(device, "tickets", count)


def tickets(device: torch.device, count: int) -> torch.Tensor:
    """`count` zero-at-rest counters of the current stream (a kernel that takes one resets it before it returns)."""
    if count == 0:
        return torch.empty(0, dtype=torch.int32, device=device)
    buf = _ensure(device, "tickets")
    if buf is None or buf.numel() < count:
        raise UnsupportedError(f"b12x split-K tickets on {device} hold fewer than {count}: sized by prepare_*")
    return buf[:count]


def streams(device: torch.device) -> int:
    """How many streams of `device` hold a set of b12x temporaries (explain, tests)."""
    return sum(1 for dev, _ in _pools if dev == _device(device))


def poison(device: torch.device) -> None:
    """Fill the device's scratch and weight workspaces, on every stream, with 0xFF bytes (NaN in bf16 and
    float32): tests call it so a kernel that skips writing a temporary it later reads shows up as NaN."""
    for (dev, _), pools in _pools.items():
        if dev == _device(device):
            for buf in pools.scratch + pools.weights:
                buf.view(torch.uint8).fill_(0xFF)
