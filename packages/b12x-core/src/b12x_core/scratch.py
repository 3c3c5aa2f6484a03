"""Per-device scratch memory for the temporaries of a call (quantized activations, MoE slot tables and
intermediates): sized by prepare_* for its max_tokens, carved into views by each call, so calls allocate
only their outputs. One buffer serves every layer of a device: calls on a stream run one after another.
Outgrown buffers stay alive, since a CUDA graph captured earlier may still read them.
"""

from __future__ import annotations

import math

import torch

from .errors import UnsupportedError

_ALIGN = 256
_buffers: dict[torch.device, list[torch.Tensor]] = {}


def nbytes(specs) -> int:
    """Bytes `carve(specs)` needs: specs are (shape, dtype) pairs."""
    total = 0
    for shape, dtype in specs:
        total = -(-total // _ALIGN) * _ALIGN + math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return total


def reserve(device: torch.device, size: int) -> None:
    held = _buffers.setdefault(device, [])
    if not held or held[-1].numel() < size:
        held.append(torch.empty(size, dtype=torch.uint8, device=device))


def carve(device: torch.device, specs) -> list[torch.Tensor]:
    """Disjoint tensors of the given (shape, dtype) from the device's scratch (contents undefined)."""
    need = nbytes(specs)
    held = _buffers.get(device)
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


def poison(device: torch.device) -> None:
    """Fill the device's scratch with 0xFF bytes (NaN in bf16 and float32): tests call it so a kernel that
    skips writing a temporary it later reads shows up as NaN."""
    for buf in _buffers.get(device, []):
        buf.fill_(0xFF)
