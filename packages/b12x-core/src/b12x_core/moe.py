"""Fused MoE (tensor-parallel only): `route_topk`, `prepare_moe` once, `moe` per call, and the TP shard helper.

Semantics (the kernels follow the same): the first GEMM's input is x quantized per `act_format`; gated SiLU
is silu(gate) · up (rows of w13 in `w13_order`), non-gated ReLU² is relu(h)²; the intermediate is rounded to
bf16 (kernels store it so) and quantized again for the second GEMM; each expert's output is scaled by its
router weight and summed over the top-k experts in float32 in a fixed order (the reference: ascending expert; the
GPU backends: the token's top-k order); one bf16 rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

import b12x_formats as bf

from . import _registry
from . import plan as plans
from ._checks import check_positive, check_tensor, check_tokens, refuse_during_capture, resolve_device
from .backends import DeviceInfo, MoEShape, Query
from .errors import UnsupportedError
from .linear import DEFAULT_MAX_TOKENS
from .recipe import activation_mode, moe_act_format
from .weights import DeviceWeights, as_shards, input_scale_of

# Weight formats of fused MoE and the activation formats each runs with: a fact of each format (FormatSpec).
MOE_FORMATS = {fmt: bf.spec(fmt).moe_activations for fmt in bf.FORMATS if bf.spec(fmt).moe_activations}
ACTIVATIONS = ("silu", "relu2")
W13_ORDERS = ("gate_up", "up_gate")


def route_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts, the top_k largest (ties → lower expert id); fp32 weights (summing to 1 when
    `renormalize`), int32 ids. Same as torch.ops.b12x.route_topk."""
    check_tensor("router_logits", router_logits, ndim=2)
    if not 1 <= top_k <= router_logits.shape[1]:
        raise ValueError(f"top_k={top_k} must be in 1..{router_logits.shape[1]} (the number of experts)")
    return torch.ops.b12x.route_topk(router_logits, top_k, renormalize)


def run_route_topk(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """On CUDA with Triton: one fused launch (b12x_kernels.topk_route), the same ids and weights within float32
    rounding as the reference, which runs everywhere else (and past the kernel's MAX_EXPERTS, where no model is)."""
    if logits.device.type == "cuda" and not DeviceInfo.of(logits.device).triton:
        from .kernels import topk_route

        if logits.shape[1] <= topk_route.MAX_EXPERTS:
            t = logits.shape[0]
            weights = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
            ids = torch.empty(t, top_k, dtype=torch.int32, device=logits.device)
            topk_route.topk_route(logits, top_k, renormalize, weights, ids)
            return weights, ids
    return route_topk_reference(logits, top_k, renormalize)


def route_topk_reference(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits.to(torch.float32), dim=-1)
    # a stable descending sort keeps the lower id first among equal probabilities
    weights, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, ids = weights[:, :top_k], ids[:, :top_k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.contiguous(), ids.to(torch.int32).contiguous()


@dataclass(eq=False)
class PreparedMoE:
    w13_format: str
    w2_format: str
    activation: str
    w13_order: str
    act_format: str
    experts: int
    hidden: int
    intermediate: int
    top_k: int
    max_tokens: int
    device: torch.device
    act_mode_13: str = "bf16"
    act_mode_2: str = "bf16"
    input_scale_13: float | None = None
    input_scale_2: float | None = None
    plan: plans.Plan | None = field(default=None, repr=False)
    handle: int = 0

    @property
    def path(self) -> str:
        return self.plan.summary()

    def __repr__(self) -> str:
        return (
            f"PreparedMoE(w13 {self.w13_format}, w2 {self.w2_format} × {self.act_format}, {self.activation}, "
            f"E={self.experts}, H={self.hidden}, I={self.intermediate}, top_k={self.top_k}, "
            f"max_tokens={self.max_tokens}, {self.device}, path={self.path})"
        )


def prepare_moe(
    w13: bf.QuantizedWeight | Sequence[bf.QuantizedWeight],
    w2: bf.QuantizedWeight,
    activation: str = "silu",
    w13_order: str = "gate_up",
    max_tokens: int = DEFAULT_MAX_TOKENS,
    top_k: int = 1,
    device="cpu",
    act_format: str = "bf16",
    path: str = "auto",
    expert_map=None,
) -> PreparedMoE:
    """w13: [E, 2I, H] (gated SiLU) or [E, I, H] (ReLU²), whole or as row shards (gate, up) that carry their
    own per-expert scales; w2: [E, H, I]. `act_format="auto"` takes the checkpoint's recipe (recipe.py)."""
    refuse_during_capture("prepare_moe")
    if expert_map is not None:
        raise UnsupportedError(
            "expert parallelism / expert maps are not supported: b12x shards MoE by tensor parallelism"
        )
    if activation not in ACTIVATIONS:
        raise UnsupportedError(f"MoE activation {activation!r} is not supported; supported: {ACTIVATIONS}")
    if w13_order not in W13_ORDERS:
        raise ValueError(f"w13_order must be one of {W13_ORDERS}, got {w13_order!r}")
    check_positive("max_tokens", max_tokens)
    w13_shards = as_shards(w13)
    w13_shape = (*w13_shards[0].shape[:-2], sum(p.shape[-2] for p in w13_shards), w13_shards[0].shape[-1])
    w13 = w13_shards[0]
    s13, s2 = input_scale_of(w13_shards), input_scale_of(w2) if isinstance(w2, bf.QuantizedWeight) else None
    if isinstance(w13, bf.QuantizedWeight) and w13.format in MOE_FORMATS:
        act_format = moe_act_format(w13.format, act_format, s13 is not None)
    for name, qw in (("w13", w13), ("w2", w2)):
        if not isinstance(qw, bf.QuantizedWeight) or len(qw.shape) != 3:
            raise UnsupportedError(f"{name} must be a QuantizedWeight [E, N, K] with a leading expert dim")
        if qw.format not in MOE_FORMATS:
            raise UnsupportedError(f"{name}: {qw.format} is not a fused-MoE format; supported: {list(MOE_FORMATS)}")
        if act_format not in MOE_FORMATS[qw.format]:
            raise UnsupportedError(
                f"{name}: {qw.format} MoE runs with act_format {list(MOE_FORMATS[qw.format])}, not {act_format!r}"
            )
    experts, hidden, inter = w2.shape
    rows = 2 * inter if activation == "silu" else inter
    if w13_shape != (experts, rows, hidden):
        raise UnsupportedError(
            f"w13 {list(w13_shape)} does not match w2 {list(w2.shape)}: {activation} needs w13 [E={experts}, "
            f"{rows}, H={hidden}]"
        )
    check_positive("top_k", top_k)
    if top_k > experts:
        raise ValueError(f"top_k={top_k} exceeds the number of experts {experts}")
    device = resolve_device(device)
    mode13 = activation_mode(w13.format, act_format, s13 is not None)
    mode2 = activation_mode(w2.format, act_format, s2 is not None)
    shape = MoEShape(experts, hidden, inter, top_k, activation, w13_order, mode2, w2.format)
    query = Query("moe", w13.format, act_format, mode13, DeviceInfo.of(device), path, rows, hidden, max_tokens,
                  moe=shape)  # fmt: skip
    weights = (DeviceWeights(w13_shards, mode13, s13, device), DeviceWeights([w2], mode2, s2, device))
    moe = PreparedMoE(
        w13_format=w13.format,
        w2_format=w2.format,
        activation=activation,
        w13_order=w13_order,
        act_format=act_format,
        experts=experts,
        hidden=hidden,
        intermediate=inter,
        top_k=top_k,
        max_tokens=max_tokens,
        device=device,
        act_mode_13=mode13,
        act_mode_2=mode2,
        input_scale_13=s13,
        input_scale_2=s2,
        plan=plans.build(query, weights),
    )
    moe.handle = _registry.register(moe)
    return moe


def check_moe_call(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, p: PreparedMoE) -> None:
    """The checks of bc.moe and torch.ops.b12x.moe."""
    check_tensor("x", x, dtype=torch.bfloat16, device=p.device, ndim=2)
    if x.shape[1] != p.hidden:
        raise UnsupportedError(f"x {list(x.shape)}: hidden size must be H={p.hidden}")
    check_tokens("x", x.shape[0], p.max_tokens)
    check_tensor("topk_weights", topk_weights, dtype=torch.float32, device=p.device, ndim=2)
    check_tensor("topk_ids", topk_ids, dtype=(torch.int32, torch.int64), device=p.device, ndim=2)
    expected = (x.shape[0], p.top_k)
    if tuple(topk_ids.shape) != expected or tuple(topk_weights.shape) != expected:
        raise ValueError(
            f"topk_ids {list(topk_ids.shape)} and topk_weights {list(topk_weights.shape)} must be [T, top_k] = "
            f"{list(expected)}"
        )


def moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, prepared: PreparedMoE) -> torch.Tensor:
    """x bf16 [T, H], topk_weights fp32 [T, k], topk_ids int32/int64 [T, k] -> bf16 [T, H]."""
    check_moe_call(x, topk_weights, topk_ids, prepared)
    return torch.ops.b12x.moe(x, topk_weights, topk_ids, prepared.handle)


def run_moe(x, topk_weights, topk_ids, p: PreparedMoE) -> torch.Tensor:
    if x.shape[0] == 0:
        return torch.empty_like(x)
    return p.plan.for_tokens(x.shape[0]).run(x, topk_weights, topk_ids)


def shard_moe_weights(
    w13: bf.QuantizedWeight, w2: bf.QuantizedWeight, rank: int, world_size: int, activation: str = "silu"
) -> tuple[bf.QuantizedWeight, bf.QuantizedWeight]:
    """Rank `rank`'s slice of the intermediate dimension: w13 rows (each of gate and up when gated) and w2
    columns, on whole quantization blocks. Summing the ranks' `moe` outputs gives the unsharded output (the
    all-reduce of tensor parallelism). Raises ValueError when I / world_size does not fall on block bounds."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    inter = w2.shape[-1]
    if inter % world_size:
        raise ValueError(f"intermediate size {inter} does not divide into {world_size} ranks")
    lo, hi = rank * inter // world_size, (rank + 1) * inter // world_size
    w2_r = bf.slice_weight(w2, cols=(lo, hi))
    if activation == "silu":
        halves = [bf.slice_weight(w13, rows=(lo + off, hi + off)) for off in (0, inter)]
        w13_r = bf.concat_rows(halves)
    else:
        w13_r = bf.slice_weight(w13, rows=(lo, hi))
    return w13_r, w2_r
