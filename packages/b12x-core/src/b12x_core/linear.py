"""Dense linear layers: `prepare_linear` once (validate, build the plan), `linear` per call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

import b12x_formats as bf

from . import _registry
from . import plan as plans
from ._checks import check_positive, check_tensor, check_tokens, refuse_during_capture, resolve_device
from .backends import DeviceInfo, Query
from .errors import UnsupportedError
from .recipe import activation_mode, linear_activation
from .weights import DeviceWeights, as_shards, input_scale_of

DEFAULT_MAX_TOKENS = 8192


@dataclass(eq=False)
class PreparedLinear:
    format: str
    activation: str  # as requested (or resolved from "auto"): bf16 | fp8 | mxfp8 | nvfp4
    act_mode: str  # the exact activation quantization (activations.MODES)
    n: int
    k: int
    max_tokens: int
    device: torch.device
    input_scale: float | None = None
    plan: plans.Plan | None = field(default=None, repr=False)
    handle: int = 0

    @property
    def path(self) -> str:
        """The backends the plan runs, with their token ranges when more than one."""
        return self.plan.summary()

    def __repr__(self) -> str:
        return (
            f"PreparedLinear({self.format} × {self.activation} [{self.act_mode}], N={self.n}, K={self.k}, "
            f"max_tokens={self.max_tokens}, {self.device}, path={self.path})"
        )


def prepare_linear(
    qw: bf.QuantizedWeight | Sequence[bf.QuantizedWeight],
    device="cpu",
    max_tokens: int = DEFAULT_MAX_TOKENS,
    activation: str = "bf16",
    path: str = "auto",
) -> PreparedLinear:
    """Validate `qw`, build its plan for (format, activation, device) and upload what the plan runs.
    `qw` may also be a sequence of row shards of one format (a fused qkv or gate_up layer whose shards
    carry their own per-tensor scales); they run as one [sum N, K] layer. `activation="auto"` takes the
    checkpoint's recipe (recipe.py)."""
    refuse_during_capture("prepare_linear")
    if not isinstance(qw, (bf.QuantizedWeight, list, tuple)):
        raise ValueError(f"prepare_linear takes a b12x_formats.QuantizedWeight, got {type(qw).__name__}")
    shards = as_shards(qw)
    fmt = shards[0].format
    if len(shards[0].shape) != 2:
        raise UnsupportedError(f"{fmt}: linear weights are [N, K], got {list(shards[0].shape)}")
    check_positive("max_tokens", max_tokens)
    device = resolve_device(device)
    scale = input_scale_of(shards)
    activation = linear_activation(fmt, activation, scale is not None)
    mode = activation_mode(fmt, activation, scale is not None)
    n, k = sum(p.shape[0] for p in shards), shards[0].shape[1]
    query = Query("linear", fmt, activation, mode, DeviceInfo.of(device), path, n, k, max_tokens,
                  tuple(p.shape[0] for p in shards))  # fmt: skip
    plan = plans.build(query, DeviceWeights(shards, mode, scale, device))
    lin = PreparedLinear(fmt, activation, mode, n, k, max_tokens, device, scale, plan)
    lin.handle = _registry.register(lin)
    return lin


def check_linear_call(x: torch.Tensor, lin: PreparedLinear, bias: torch.Tensor | None) -> None:
    """The checks of bc.linear and torch.ops.b12x.linear (the op runs them too: a wrongly typed tensor would
    otherwise reach a kernel that reads its bytes as bf16)."""
    check_tensor("x", x, dtype=torch.bfloat16, device=lin.device)
    if x.dim() == 0 or x.shape[-1] != lin.k:
        raise UnsupportedError(f"x {list(x.shape)}: last dim must be K={lin.k} of the {lin.format} weight")
    check_tokens("x", x.numel() // lin.k, lin.max_tokens)
    if bias is not None:
        check_tensor("bias", bias, dtype=(torch.bfloat16, torch.float32), device=lin.device, ndim=1)
        if bias.shape[0] != lin.n:
            raise ValueError(f"bias {list(bias.shape)} must have N={lin.n} entries")


def linear(x: torch.Tensor, lin: PreparedLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """bf16 [..., K] -> bf16 [..., N]; the same as torch.ops.b12x.linear."""
    check_linear_call(x, lin, bias)
    return torch.ops.b12x.linear(x, lin.handle, bias)


def run_linear(x: torch.Tensor, lin: PreparedLinear, bias: torch.Tensor | None) -> torch.Tensor:
    """The op's body: the plan's row for this many tokens."""
    x2 = x.reshape(-1, lin.k)
    if x2.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], lin.n)
    y = lin.plan.for_tokens(x2.shape[0]).run(x2, bias)
    return y.reshape(*x.shape[:-1], lin.n)
