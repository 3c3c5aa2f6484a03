"""The per-device buffer pools every prepared op shares, sized by prepare_* (calls allocate only their outputs):

- scratch: a call's temporaries (quantized activations, MoE slot tables and intermediates), carved into views
  by each call. One buffer serves every layer of a device: calls on a stream run one after another.
- the bf16 weight workspace: where the decode + dense GEMM backend decodes a weight before its GEMM, as large as
  the largest layer that uses it.
- tickets: int32 counters that split-K kernels take and reset (zero at rest), as many as the largest grid needs.

Outgrown buffers stay alive: a CUDA graph captured earlier may still read them.
"""

from __future__ import annotations

import math

import torch

from .errors import UnsupportedError

_ALIGN = 256
_scratch: dict[torch.device, list[torch.Tensor]] = {}
_weights: dict[torch.device, list[torch.Tensor]] = {}
_tickets: dict[torch.device, list[torch.Tensor]] = {}


def nbytes(specs) -> int:
    """Bytes `carve(specs)` needs: specs are (shape, dtype) pairs."""
    total = 0
    for shape, dtype in specs:
        total = -(-total // _ALIGN) * _ALIGN + math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return total


def _grow(pool: dict, device: torch.device, size: int, dtype: torch.dtype) -> None:
    held = pool.setdefault(device, [])
    if not held or held[-1].numel() < size:
        held.append(torch.empty(size, dtype=dtype, device=device))


def reserve_scratch(device: torch.device, size: int) -> None:
    """Grow the device's scratch to `size` bytes (prepare time)."""
    _grow(_scratch, device, size, torch.uint8)


def carve(device: torch.device, specs) -> list[torch.Tensor]:
    """Disjoint tensors of the given (shape, dtype) from the device's scratch (contents undefined)."""
    need = nbytes(specs)
    held = _scratch.get(device)
    if not held or held[-1].numel() < need:
        have = held[-1].numel() if held else 0
        raise UnsupportedError(f"b12x scratch on {device} holds {have} bytes, this call needs {need}: "
                               "the call exceeds the max_tokens its op was prepared for")  # fmt: skip
    buf, out, offset = held[-1], [], 0
    for shape, dtype in specs:
        offset = -(-offset // _ALIGN) * _ALIGN
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        out.append(buf[offset : offset + size].view(dtype).view(shape))
        offset += size
    return out


def reserve_weights(device: torch.device, numel: int) -> None:
    """Grow the device's bf16 weight workspace to `numel` elements (prepare time)."""
    _grow(_weights, device, numel, torch.bfloat16)


def weights(device: torch.device, n: int, k: int) -> torch.Tensor:
    """The bf16 weight workspace as an [n, k] view (contents undefined)."""
    held = _weights.get(device)
    if not held or held[-1].numel() < n * k:
        raise UnsupportedError(f"b12x bf16 weight workspace on {device} is smaller than [{n}, {k}]: it is sized by "
                               "prepare_linear for the layers that decode into it")  # fmt: skip
    return held[-1][: n * k].view(n, k)


def reserve_tickets(device: torch.device, count: int) -> None:
    """Grow the device's zeroed split-K tickets to `count` counters (prepare time)."""
    held = _tickets.setdefault(device, [])
    if not held or held[-1].numel() < count:
        held.append(torch.zeros(count, dtype=torch.int32, device=device))


def tickets(device: torch.device, count: int) -> torch.Tensor:
    """`count` zero-at-rest counters (a kernel that takes one resets it before it returns)."""
    held = _tickets.get(device)
    if not held or held[-1].numel() < count:
        raise UnsupportedError(f"b12x split-K tickets on {device} hold fewer than {count}: sized by prepare_*")
    return held[-1][:count]


def poison(device: torch.device) -> None:
    """Fill the device's pools with 0xFF bytes (NaN in bf16 and float32): tests call it so a kernel that skips
    writing a temporary it later reads shows up as NaN."""
    for pool in (_scratch, _weights):
        for buf in pool.get(device, []):
            buf.view(torch.uint8).fill_(0xFF)
