"""Running one check: random weights, the backend alone (a plan of that backend only, as the fast GPU tier builds it)
on the device at each of checks.TOKENS, against b12x-core's CPU reference, twice (the second run must give the same
bits). Outputs are compared with the GPU tests' closeness rule, copied here because the tests are not installed.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch

import b12x_formats as bf

from .. import plan, workspace
from ..activations import quantize_activation
from ..backends import DeviceInfo, for_op
from ..backends.reference import expert_activation, moe_reference
from ..backends.tensor_core_moe import TensorCoreMoE
from ..embedding import PreparedEmbedding, embedding, prepare_embedding
from ..linear import linear, prepare_linear
from ..moe import prepare_moe, route_topk
from ..weights import DeviceWeights, as_shards
from . import checks as shapes  # read at each check: a test may shrink them
from .checks import Check


@dataclass(frozen=True)
class Result:
    check: Check
    status: str  # pass | fail | skip
    detail: str = ""  # fail: what differed, or the error; skip: why it did not run
    error: float | None = None  # the largest |y − y_ref| / max(|y_ref|, rms(y_ref)) over the token counts
    seconds: float = 0.0


# ------------------------------------------------------------------------------------------------ the tolerance
# Mirrors tests/closeness.py (close and rounding_slack), which the GPU tests hold every kernel to: both sides sum in
# fp32 in different orders and round to bf16, so |y − y_ref| ≤ 1e-2 · max(|y_ref|, rms(y_ref)) + 2^-7·|y_ref| (one
# bf16 ulp) + slack, and no NaN. Change both together.
ROUNDED_DECODES = ("Q8_0", "IQ2_XXS", "IQ2_XS")  # formats whose decode rounds each weight once to bf16


def closeness(y: torch.Tensor, ref: torch.Tensor, slack: torch.Tensor | float = 0.0) -> tuple[bool, float]:
    """(within tolerance, largest |y − y_ref| / max(|y_ref|, rms(y_ref))): NaN anywhere in y fails."""
    y, ref = y.float().cpu(), ref.float().cpu()
    scale = torch.maximum(ref.abs(), ref.square().mean().sqrt())
    diff = (y - ref).abs()
    ok = not bool(torch.isnan(y).any()) and bool((diff <= 1e-2 * scale + 2**-7 * ref.abs() + slack).all())
    return ok, float((diff / scale).nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0


def rounding_slack(fmt: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | float:
    """For y = x @ w.T: the most one bf16 rounding of each weight (|Δw| ≤ 2^-9·|w|) can move each output, for the
    formats whose decode rounds (0 for the others, whose decodes are exact)."""
    if fmt not in ROUNDED_DECODES:
        return 0.0
    return (2.0**-9 * (x.double().abs() @ w.double().abs().T)).float()


# ------------------------------------------------------------------------------------------------------ inputs
def random_weight(rng: np.random.Generator, fmt: str, shape: tuple[int, ...]) -> bf.QuantizedWeight:
    """Weights near N(0, 1/K), quantized. IQ2 from random blocks instead (the IQ2 search takes seconds, and random
    bytes reach every grid index, sign pattern and sub-block scale the kernels must decode), each block's fp16 d
    drawn so the weights come out at that size: random blocks decode to an RMS of about 55·d."""
    k = shape[-1]
    if fmt.startswith("IQ2"):
        spec = bf.spec(fmt)
        blocks = rng.integers(0, 256, size=(*shape[:-1], k // spec.group_size, spec.block_bytes), dtype=np.uint8)
        d = rng.uniform(0.5, 1.5, size=blocks.shape[:-1]) / (55.0 * np.sqrt(k))
        blocks[..., :2] = d.astype(np.float16)[..., None].view(np.uint8)
        return bf.QuantizedWeight.from_tensors(fmt, {"weight": blocks})
    return bf.quantize((rng.standard_normal(shape) / np.sqrt(k)).astype(np.float32), fmt)


def with_input_scale(qw: bf.QuantizedWeight, amax: float, experts: int | None = None) -> bf.QuantizedWeight:
    """The checkpoint's static activation scale for inputs up to `amax` (NVFP4: amax / (6 · 448), FP8: amax / 448),
    one per expert where `experts` is given."""
    scale = np.float32(amax / (6 * 448) if qw.format.endswith("NVFP4") else amax / 448)
    value = scale if experts is None else np.full(experts, scale, np.float32)
    return bf.QuantizedWeight.from_tensors(qw.format, {**qw.tensors, "input_scale": value})


def bf16(rng: np.random.Generator, *shape: int) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)


def iq2_as_the_lanes_decode(qw: bf.QuantizedWeight) -> np.ndarray:
    """float32 IQ2 weights as the tensor-core kernels multiply them: grid·sign·(0.5+s)/4 rounded once to bf16, times
    the block's fp16 d in fp32 (exact), where the reference rounds d·grid·sign·(0.5+s)/4 once. The two differ by up
    to 2^-8 of a weight, which the MoE's two chained GEMMs carry past the tolerance, so the MoE reference of these
    kernels takes this decode (the GPU tests take the same values from a model of the lanes, mma_emulator)."""
    blocks = np.array(qw.tensors["weight"], copy=True)
    d = blocks[..., :2].copy().view(np.float16).astype(np.float32)  # [..., K/256, 1]
    blocks[..., :2] = np.float16(1.0)[None].view(np.uint8)  # decode with d = 1: the products before d, exact
    unit = bf.dequantize(bf.QuantizedWeight.from_tensors(qw.format, {"weight": blocks}))
    rounded = torch.from_numpy(unit).to(torch.bfloat16).float().numpy()
    group = bf.spec(qw.format).group_size
    return (rounded.reshape(*d.shape[:-1], group) * d).reshape(unit.shape)


# ------------------------------------------------------------------------------------------------------ checks
def _backend(check: Check):
    return next(cls for cls in for_op(check.family) if cls.name == check.backend)


def _on(query, device: torch.device):
    """The CPU reference's query for the device: what prepare_* builds there, asked of one backend."""
    return dataclasses.replace(query, device=DeviceInfo.of(device))


def _compare(outcomes: list[tuple[int, bool, float, bool]]) -> tuple[str, str, float]:
    """(status, detail, largest error) from (tokens, close, error, same bits twice) per token count."""
    worst = max(error for _, _, error, _ in outcomes)
    bad = [f"{m} tokens: error {error:.3g}" for m, ok, error, _ in outcomes if not ok]
    bad += [f"{m} tokens: a second run gave other bits" for m, _, _, same in outcomes if not same]
    return ("fail", "; ".join(bad), worst) if bad else ("pass", "", worst)


def run_linear(check: Check, device: torch.device, rng: np.random.Generator) -> tuple[str, str, float]:
    x = bf16(rng, max(shapes.TOKENS), shapes.LINEAR_K)
    qw = random_weight(rng, check.format, (shapes.LINEAR_N, shapes.LINEAR_K))
    if check.scaled:
        qw = with_input_scale(qw, float(x.float().abs().max()))
    bias = bf16(rng, shapes.LINEAR_N)
    ref = prepare_linear(qw, max_tokens=max(shapes.TOKENS), activation=check.activation)
    weights = DeviceWeights(as_shards(qw), ref.act_mode, ref.input_scale, device)
    alone = plan.build(_on(ref.plan.query, device), weights, only=_backend(check), warm=False)
    w = torch.from_numpy(bf.dequantize(qw))
    outcomes = []
    for m in shapes.TOKENS:
        workspace.poison(device)  # temporaries must be written before they are read
        row = alone.for_tokens(m)
        y = row.run(x[:m].to(device), bias.to(device))
        ok, error = closeness(y, linear(x[:m], ref, bias), rounding_slack(check.format, x[:m], w))
        outcomes.append((m, ok, error, torch.equal(row.run(x[:m].to(device), bias.to(device)), y)))
    return _compare(outcomes)


def quantizer_flips(x, weights, ids, query, w13, w2, input_scales) -> torch.Tensor:
    """Per output element, what quantizing the second GEMM's input can move between kernels and reference (mirrors
    tests/kernels/test_moe_tiles.py's quantizer_flips). Where the float32 intermediate sits within 2e-5 of a bf16
    rounding midpoint, the kernels (summing in another order) may round it to the other neighbour; quantized to
    mxfp8/nvfp4, that can cross a quantizer boundary or change its group's scale. Bounded by quantizing the
    intermediate with such elements moved (all of them; those below their row's largest; the largest alone).
    Zero for bf16 activations, which the ulp term covers."""
    shape = query.moe
    bound = torch.zeros(x.shape[0], shape.hidden, dtype=torch.float32)
    if shape.act_mode_2 == "bf16":
        return bound
    xq = quantize_activation(x, query.act_mode, input_scales[0])
    for e in range(shape.experts):
        tokens, slots = (ids == e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        a32 = expert_activation(xq[tokens] @ w13[e].T, shape)
        a = a32.to(torch.bfloat16).float()
        ulp = torch.ldexp(torch.ones_like(a), torch.frexp(a)[1] - 8)  # bf16: 8 significant bits
        near = ((a32 - a).abs() - ulp / 2).abs() <= 2e-5 * a32.abs()
        largest = a.abs() >= 0.5 * a.abs().amax(dim=1, keepdim=True)  # candidates for a group's scale
        q = quantize_activation(a, shape.act_mode_2, input_scales[1])
        delta = torch.zeros_like(a)
        for moves in (near, near & ~largest, near & largest):
            moved = torch.where(moves, a + torch.sign(a32 - a) * ulp, a)
            delta += (quantize_activation(moved, shape.act_mode_2, input_scales[1]) - q).abs()
        bound.index_add_(0, tokens, (delta @ w2[e].abs().T) * weights[tokens, slots, None])
    return bound


def moe_weights(ref, cls, w13: bf.QuantizedWeight, w2: bf.QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's float32 expert weights as the kernels multiply them: GGML formats rounded to bf16 as the
    kernels decode them (the other formats decode exactly; their per-tensor factors apply in float32 after the
    dot), IQ2 on the tensor-core MoE as its lanes decode it."""
    exact = ref.plan.rows[0].backend  # ReferenceMoE: float32 [E, 2I, H], [E, H, I]
    if w13.format.startswith("IQ2") and issubclass(cls, TensorCoreMoE):
        return tuple(torch.from_numpy(iq2_as_the_lanes_decode(w)) for w in (w13, w2))
    if bf.spec(w13.format).packing == "ggml":
        return exact.w13.to(torch.bfloat16).float(), exact.w2.to(torch.bfloat16).float()
    return exact.w13, exact.w2


def run_moe(check: Check, device: torch.device, rng: np.random.Generator) -> tuple[str, str, float]:
    t, e = max(shapes.TOKENS), shapes.MOE_EXPERTS
    x = bf16(rng, t, shapes.MOE_HIDDEN)
    w13 = random_weight(rng, check.format, (e, 2 * shapes.MOE_INTER, shapes.MOE_HIDDEN))
    w2 = random_weight(rng, check.format, (e, shapes.MOE_HIDDEN, shapes.MOE_INTER))
    if check.scaled:  # the intermediate silu(gate)·up of these weights stays below 4
        w13, w2 = with_input_scale(w13, float(x.float().abs().max()), e), with_input_scale(w2, 4.0, e)
    weights, ids = route_topk(torch.from_numpy(rng.standard_normal((t, e)).astype(np.float32)), shapes.MOE_TOP_K)
    ref = prepare_moe(w13, w2, max_tokens=t, top_k=shapes.MOE_TOP_K, act_format=check.activation)
    stacks = (DeviceWeights(as_shards(w13), ref.act_mode_13, ref.input_scale_13, device),
              DeviceWeights([w2], ref.act_mode_2, ref.input_scale_2, device))  # fmt: skip
    cls = _backend(check)
    alone = plan.build(_on(ref.plan.query, device), stacks, only=cls, warm=False)
    query, scales = ref.plan.query, ref.plan.rows[0].backend.input_scales
    f13, f2 = moe_weights(ref, cls, w13, w2)
    outcomes = []
    for m in shapes.TOKENS:
        args = (x[:m], weights[:m], ids[:m])
        workspace.poison(device)
        row = alone.for_tokens(m)
        y = row.run(*(a.to(device) for a in args))
        slack = quantizer_flips(*args, query, f13, f2, scales)
        ok, error = closeness(y, moe_reference(*args, query, f13, f2, scales), slack)
        outcomes.append((m, ok, error, torch.equal(row.run(*(a.to(device) for a in args)), y)))
    return _compare(outcomes)


def run_embedding(check: Check, device: torch.device, rng: np.random.Generator) -> tuple[str, str, float]:
    """The gather decodes each row exactly as the reference does: the bits must be equal."""
    qw = bf.quantize(
        rng.standard_normal((shapes.EMBEDDING_VOCAB, shapes.EMBEDDING_HIDDEN)).astype(np.float32), check.format
    )
    ref = prepare_embedding(qw)
    table = PreparedEmbedding(ref.vocab, ref.hidden, device, ref.blocks.to(device))
    alone = plan.build(_on(ref.plan.query, device), table, only=_backend(check), warm=False)
    ids = torch.from_numpy(rng.integers(0, shapes.EMBEDDING_VOCAB, size=max(shapes.TOKENS)))
    outcomes = []
    for m in shapes.TOKENS:
        y = alone.for_tokens(m).run(ids[:m].to(device)).cpu()
        expect = embedding(ids[:m], ref)
        same = torch.equal(y, expect)
        error = 0.0 if same else float((y.float() - expect.float()).abs().max())
        outcomes.append((m, same, error, True))
    return _compare(outcomes)


RUNNERS = {"linear": run_linear, "moe": run_moe, "embedding": run_embedding}


def lost_context(detail: str) -> bool:
    """Whether a failure's detail is a CUDA error (an illegal address, a launch failure): it leaves the process's
    CUDA context unusable, so every later check would fail with it."""
    return "CUDA error" in detail or detail.startswith("AcceleratorError")


def run(check: Check, device: torch.device, rng: np.random.Generator) -> Result:
    """The check's result; an exception is a failure that names it."""
    if check.skip:
        return Result(check, "skip", check.skip)
    start = time.perf_counter()
    try:
        status, detail, error = RUNNERS[check.family](check, device, rng)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # an asynchronous error is this check's
    except Exception as err:  # noqa: BLE001  (reported, and the exit status says it failed)
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        status, detail, error = "fail", f"{type(err).__name__}: {first}"[:300], None
    return Result(check, status, detail, error, time.perf_counter() - start)
