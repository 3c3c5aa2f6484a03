"""What every backend is: a class that says whether it can run a query (`can_implement`, with the reason) and
which configurations it runs over a token range (`configs`: from the query alone, so a preview needs no
weights), and once prepared (an instance holding the device weights), how it runs one call.

In the manner of vLLM's linear-kernel classes: the plan (b12x_core/plan/) walks the registry, asks each class
`can_implement(query)`, picks per token range from measured tables, then `prepare`s only the classes it picked.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import ClassVar

import torch

Config = dict  # a backend's configuration of one plan row: plain values, printed by explain
UNBOUNDED = sys.maxsize  # the last token of an op without max_tokens (embedding)


@dataclass(frozen=True)
class DeviceInfo:
    """The facts of a device that backends and the plan read (looked up once, so a plan can also be worked out
    for a device that is not here: tests build one for an H200 on a CPU machine)."""

    device: torch.device
    capability: tuple[int, int] | None = None  # CUDA compute capability; None off CUDA
    sms: int = 4  # streaming multiprocessors (off CUDA: 4, so the interpreter's MoE tests split K too)
    smem_kb: int = 99  # shared memory per block (off CUDA: SM12x's budget)
    kernels: str = ""  # why b12x_kernels' CUDA extension cannot run here ('' when it can)
    triton: str = ""  # why the Triton kernels cannot run here ('' when they can)
    block_scaled_mm: str = ""  # why torch's block-scaled FP8 GEMM cannot run here ('' when it can)
    sm90_mixed: str = ""  # why the CUTLASS SM90 GEMM of b12x_kernels cannot run here ('' when it can)
    # The CUDA device's name ("NVIDIA H200"; '' off CUDA): the measured tables' key before the capability
    # (timings.py), as GPUs of one capability differ in memory bandwidth
    name: str = ""

    @property
    def arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else self.device.type

    @staticmethod
    def of(device: torch.device) -> DeviceInfo:
        return _device_info(device)


def _kernels_reason() -> str:
    from .. import kernels

    return kernels.unavailable_reason()


def _triton_reason() -> str:
    try:
        import triton  # noqa: F401

        from ..kernels import tiles  # noqa: F401
    except ImportError as err:
        return f"Triton is not importable ({err})"
    return ""


def _sm90_mixed_reason(capability: tuple[int, int]) -> str:
    from .. import kernels

    if capability != kernels.interface.SM90_MIXED_CAPABILITY:
        return f"it runs sm_90a only: needs compute capability 9.0, this is sm_{capability[0]}{capability[1]}"
    if kernels.built() and not kernels.sm90_mixed_built():
        return "this build of b12x-kernels holds no sm_90a CUTLASS kernels (it did not target sm_90)"
    return ""


def _block_scaled_reason(capability: tuple[int, int]) -> str:
    functional = torch.nn.functional
    if not hasattr(functional, "scaled_mm") or not hasattr(getattr(functional, "ScalingType", None), "BlockWise1x128"):
        return f"torch {torch.__version__} has no block-wise scaled_mm (torch.nn.functional.ScalingType.BlockWise1x128)"
    if capability[0] != 9:
        return f"cuBLASLt's block-scaled FP8 GEMM is verified on sm_90 only, this is sm_{capability[0]}{capability[1]}"
    return ""


def sm90_mixed_reason(q) -> str:
    """Why the device cannot run the CUTLASS SM90 family's sm_90a kernels (linear and grouped alike); "" where it
    can."""
    from .. import kernels

    if q.device.capability != kernels.interface.SM90_MIXED_CAPABILITY:
        return f"runs sm_90a only (wgmma, TMA): needs compute capability 9.0, this is {q.device.arch}"
    return q.device.sm90_mixed


@functools.cache
def _device_info(device: torch.device) -> DeviceInfo:
    if device.type != "cuda" or not torch.cuda.is_available():
        reason = f"needs a CUDA device, the op is on {device}" if device.type != "cuda" else "no CUDA device"
        return DeviceInfo(device, kernels=reason, triton=reason, block_scaled_mm=reason, sm90_mixed=reason)
    props = torch.cuda.get_device_properties(device)
    capability = (props.major, props.minor)
    return DeviceInfo(device, capability, props.multi_processor_count, props.shared_memory_per_block_optin // 1024,
                      _kernels_reason(), _triton_reason(), _block_scaled_reason(capability),
                      _sm90_mixed_reason(capability), props.name)  # fmt: skip


@dataclass(frozen=True)
class MoEShape:
    experts: int
    hidden: int
    intermediate: int
    top_k: int
    activation: str  # silu | relu2
    w13_order: str  # gate_up | up_gate
    act_mode_2: str  # the down GEMM's activation quantization (act_mode is the gate/up GEMM's)
    w2_format: str  # the down projection's format (format is w13's)


@dataclass(frozen=True)
class Overrides:
    """Settings a test or a benchmark forces on a plan where the plan's own rule decides otherwise (None: the rule).
    They travel in the Query, so two plans built side by side can differ and nothing global changes; a plan that
    prepare_* builds carries none."""

    holds_rows: bool | None = None  # tensor_core_moe: 8-slot blocks hold their rows (on / off); None: the MoE table
    fuses: bool | None = None  # tensor_core_moe: routing and combine inside the GEMMs (within the kernel's limits)
    short_ctas: bool = True  # tensor_core_moe: 112- / 96-row grouped CTAs where no 128-row one fits the device


@dataclass(frozen=True)
class Query:
    """What a prepared op asks of the backends: the op, its weight and activation, shape and device."""

    op: str  # linear | moe | embedding
    format: str  # the weight format (MoE: w13's; w2 shares it)
    activation: str  # as requested: bf16 | fp8 | mxfp8 | nvfp4
    act_mode: str  # the exact activation quantization (activations.MODES)
    device: DeviceInfo
    path: str = "auto"  # auto | reference
    n: int = 0  # output features (0: any, as capabilities() asks)
    k: int = 0  # input features (0: any)
    max_tokens: int = 1
    shard_rows: tuple[int, ...] = ()  # rows of each fused shard
    moe: MoEShape | None = field(default=None)
    shares_bytes: bool = False  # the weight's device bytes belong to another op (a tied LM head's embedding)
    overrides: Overrides = Overrides()  # what a test or benchmark forces on the plan

    @property
    def on_cuda(self) -> bool:
        return self.device.device.type == "cuda"


class Backend:
    """Base class of every backend. A subclass sets `name` and `op`, implements `can_implement` and `run`, and
    overrides `configs`, `prepare`, `reserve`, `scratch_bytes` where it needs them. The class answers questions
    about a query (`can_implement`, `configs`); instances are prepared backends: they hold what the calls read
    (device layouts from b12x_core.weights)."""

    name: ClassVar[str]
    op: ClassVar[str]  # linear | moe | embedding
    # The token range where the conservative default plan (a GPU without measurements) prefers this backend;
    # registry order breaks ties. None: open-ended.
    default_tokens: ClassVar[tuple[int, int | None]] = (1, None)
    warm: ClassVar[bool] = True  # run every plan row once at prepare (compiles kernels, initialises libraries)
    # The device layouts of the weight it can run from (weights.py DeviceWeights): "checkpoint" (the checkpoint's
    # bytes stacked along N, and views of them), "mma" (the tensor-core GEMM's repacked tiles). A plan keeps one
    # copy of the weight: its backends share a layout they all read (plan/copies.py one_copy).
    reads: ClassVar[tuple[str, ...]] = ("checkpoint",)

    def __init__(self, query: Query, weights):
        self.query, self.weights = query, weights

    @classmethod
    def can_implement(cls, query: Query) -> tuple[bool, str]:
        """(True, what it does) or (False, why not), from the query alone (no device work)."""
        raise NotImplementedError

    @classmethod
    def prepare(cls, query: Query, weights) -> Backend:
        """Upload what the calls need (once per prepared op)."""
        return cls(query, weights)

    @classmethod
    def configs(cls, query: Query, lo: int, hi: int, layout: str | None = None) -> list[tuple[int, int, Config]]:
        """The configurations calls of lo..hi tokens run with: consecutive (first, last, config) covering lo..hi.
        Pure: from the query (and `layout`, the weight layout the plan keeps for every backend, None when each
        reads its own), never from prepared weights, so preview and prepare agree."""
        return [(lo, hi, {})]

    def scratch_bytes(self, tokens: int, config: Config) -> int:
        """Scratch bytes a call of `tokens` tokens with `config` carves (workspace.carve)."""
        return 0

    def reserve(self, rows: list[tuple[int, int, Config]]) -> None:
        """Grow shared workspaces this backend needs beyond the scratch for its plan rows (prepare time)."""

    def run(self, *args, config: Config):
        raise NotImplementedError


def cuda_reason(query: Query, *, triton: bool = False, kernels: bool = True) -> str:
    """Why a CUDA backend cannot take the query whatever its shape ('' when it can)."""
    if not query.on_cuda:
        return f"needs a CUDA device, the op is on {query.device.device}"
    if query.path == "reference":
        return "path='reference' was asked for"
    return (kernels and query.device.kernels) or (triton and query.device.triton) or ""


def config_ranges(lo: int, hi: int, config_of) -> list[tuple[int, int, dict]]:
    """Maximal runs of equal config_of(m) over m in lo..hi."""
    out: list[tuple[int, int, dict]] = []
    for m in range(lo, hi + 1):
        config = config_of(m)
        if out and out[-1][2] == config:
            out[-1] = (out[-1][0], m, config)
        else:
            out.append((m, m, config))
    return out
