"""Argument checks shared by the ops: each raises with the tensor, its shape and the rule."""

from __future__ import annotations

import torch

from .errors import UnsupportedError


def resolve_device(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return device


def refuse_during_capture(what: str) -> None:
    """prepare_* allocates and uploads; doing so while a CUDA graph is being captured would be recorded."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{what} must run before CUDA graph capture, not during it")


def check_positive(name: str, value: int) -> int:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_tensor(name: str, t, *, dtype=None, device=None, ndim=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype not in (dtype if isinstance(dtype, tuple) else (dtype,)):
        raise ValueError(f"{name} {list(t.shape)} has dtype {t.dtype}; expected {dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, but the prepared op lives on {device}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {list(t.shape)}")


def check_tokens(name: str, tokens: int, max_tokens: int) -> None:
    if tokens > max_tokens:
        raise UnsupportedError(f"{name} has {tokens} tokens, more than max_tokens={max_tokens} given to prepare")
