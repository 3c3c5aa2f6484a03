"""b12x's dense FP8 / FP8-block / MXFP8 / NVFP4 / MXFP4 kernels as candidates of vLLM's own linear-kernel
selection, so checkpoints that vLLM's quantization methods load (fp8, compressed-tensors, ModelOpt without the
b12x flags, ...) reach them too.

Each class adapts the layer as vLLM's method left it (the layouts its emulation kernels read) to a
`b12x_formats.QuantizedWeight`, prepares it with `bc.prepare_linear` and runs `bc.linear`. They are offered
after the established backends and before emulation on CUDA, and belong to `--linear-backend b12x`. They run
where b12x has a native CUDA path for the combination (SM90 here; SM12x compiled for) and say why not elsewhere.

vLLM picks W4A16 NVFP4 kernels from a fixed tuple inside `init_nvfp4_linear_kernel`, which a plugin cannot
extend: W4A16 NVFP4 checkpoints reach b12x through its quantization config (`--linear-backend b12x`) instead.
"""

from __future__ import annotations

import torch

import b12x_core as bc
import b12x_formats as bf

from . import report
from ._params import max_tokens_from_vllm
from ._reload import keep_addresses


def _native_path(fmt: str, activation: str) -> tuple[bool, str | None]:
    """Supported when b12x runs (fmt × activation) natively on the current CUDA device."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return False, "b12x kernels run on CUDA devices"
    try:
        rows = bc.capabilities(torch.device("cuda", torch.cuda.current_device()))
    except Exception as err:  # no device, no driver
        return False, f"b12x cannot inspect the CUDA device ({err})"
    path = next((r.path for r in rows if r.op == "linear" and r.format == fmt and r.activation == activation), None)
    if path in (None, "unsupported", "reference"):
        return False, f"b12x has no CUDA path for linear {fmt} × {activation} here ({path})"
    return True, None


def _prepare(layer, qw: bf.QuantizedWeight, activation: str) -> None:
    prepared = bc.prepare_linear(
        qw, device=layer.weight.device, max_tokens=max_tokens_from_vllm(), activation=activation
    )
    layer.b12x_linear = keep_addresses(getattr(layer, "b12x_linear", None), prepared)
    report.record(getattr(layer, "prefix", ""), layer.b12x_linear)


class _B12xKernel:
    """What every class below shares (listed first among its bases, so it fills vLLM's abstract methods):
    support is b12x's CUDA path for (b12x_format, b12x_activation); the run is bc.linear."""

    b12x_format: str
    b12x_activation: str

    @classmethod
    def is_supported(cls, compute_capability: int | None = None):
        return _native_path(cls.b12x_format, cls.b12x_activation)

    def apply_weights(self, layer, x, bias=None, **kwargs):
        return bc.linear(x, layer.b12x_linear, bias)


def _scalar(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().reshape(-1).max().reshape(())


def kernel_classes() -> dict[str, type]:
    """family -> kernel class (built on first use: the base classes live in vLLM)."""
    from vllm.model_executor.kernels.linear import (
        Fp8BlockScaledMMLinearKernel,
        FP8ScaledMMLinearKernel,
        MxFp4LinearKernel,
        Mxfp8LinearKernel,
        NvFp4LinearKernel,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape, kMxfp8Dynamic

    class B12xCoreFp8LinearKernel(_B12xKernel, FP8ScaledMMLinearKernel):
        """Per-tensor FP8 weights; static per-tensor or dynamic per-token FP8 activations (W8A8)."""

        b12x_format, b12x_activation = "FP8", "fp8"

        @classmethod
        def can_implement(cls, c):
            if not c.weight_quant_key.scale.group_shape.is_per_tensor():
                return False, "needs a per-tensor weight scale"
            act = c.activation_quant_key.scale
            if not (
                (act.static and act.group_shape.is_per_tensor()) or (not act.static and act.group_shape.is_per_token())
            ):
                return False, "needs static per-tensor or dynamic per-token activation scales"
            if c.input_dtype != torch.bfloat16:
                return False, f"needs bf16 activations, got {c.input_dtype}"
            return True, None

        def process_weights_after_loading(self, layer) -> None:
            w, w_s, x_s, _ = self._get_layer_params(layer)
            tensors = {"weight": w.t().contiguous(), "weight_scale": _scalar(w_s)}  # vLLM holds FP8 weights as [K, N]
            if self.config.activation_quant_key.scale.static:
                tensors["input_scale"] = _scalar(x_s)
            _prepare(layer, bf.QuantizedWeight.from_tensors("FP8", tensors), "fp8")

        def apply_scaled_mm(self, **kwargs):
            raise NotImplementedError("b12x runs the whole linear in apply_weights")

    class B12xCoreFp8BlockLinearKernel(_B12xKernel, Fp8BlockScaledMMLinearKernel):
        """128×128-block FP8 weights with dynamic 1×128 FP8 activations."""

        b12x_format, b12x_activation = "FP8_BLOCK", "fp8"

        @classmethod
        def can_implement(cls, c):
            if c.weight_quant_key.scale.group_shape != GroupShape(128, 128):
                return False, "needs 128×128 weight blocks"
            if c.activation_quant_key.scale.static or c.activation_quant_key.scale.group_shape != GroupShape(1, 128):
                return False, "needs dynamic 1×128 activation groups"
            return True, None

        def process_weights_after_loading(self, layer) -> None:
            params = self._get_layer_params(layer)
            scale = params.block_scale
            if scale.dtype in (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8)):  # UE8M0 → float32
                scale = torch.ldexp(torch.ones_like(scale, dtype=torch.float32), scale.view(torch.uint8).int() - 127)
            qw = bf.QuantizedWeight.from_tensors(
                "FP8_BLOCK", {"weight": params.weight, "weight_scale_inv": scale.float()}
            )
            _prepare(layer, qw, "fp8")

        def apply_block_scaled_mm(self, **kwargs):
            raise NotImplementedError("b12x runs the whole linear in apply_weights")

    class B12xCoreMxfp8LinearKernel(_B12xKernel, Mxfp8LinearKernel):
        """MXFP8 weights, MXFP8 activations."""

        b12x_format, b12x_activation = "MXFP8", "mxfp8"

        @classmethod
        def can_implement(cls, c):
            if c.bmm_batch_size is not None:
                return False, "batched (bmm) MXFP8 is not a linear layer"
            return True, None

        def process_weights_after_loading(self, layer) -> None:
            n, k = layer.weight.shape
            scale = layer.weight_scale.data[:n, : k // 32].contiguous()  # some methods pad the scales
            qw = bf.QuantizedWeight.from_tensors("MXFP8", {"weight": layer.weight.data, "weight_scale": scale})
            _prepare(layer, qw, "mxfp8")

    class B12xCoreNvFp4LinearKernel(_B12xKernel, NvFp4LinearKernel):
        """NVFP4 weights with NVFP4 activations (W4A4: the checkpoint's global input scale)."""

        b12x_format, b12x_activation = "NVFP4", "nvfp4"

        @classmethod
        def can_implement(cls, c):
            return True, None

        def process_weights_after_loading(self, layer) -> None:
            tensors = {"weight": layer.weight.data, "weight_scale": layer.weight_scale.data,
                       "weight_scale_2": _scalar(layer.weight_global_scale)}  # fmt: skip
            activation = "bf16"
            if getattr(layer, "input_global_scale", None) is not None:
                tensors["input_scale"], activation = _scalar(layer.input_global_scale), "nvfp4"
            _prepare(layer, bf.QuantizedWeight.from_tensors("NVFP4", tensors), activation)

    class B12xCoreMxFp4LinearKernel(_B12xKernel, MxFp4LinearKernel):
        """MXFP4 weights with bf16 (weight-only) or MXFP8 activations."""

        b12x_format, b12x_activation = "MXFP4", "bf16"

        @classmethod
        def can_implement(cls, c):
            if c.activation_quant_key not in (None, kMxfp8Dynamic):
                return False, "runs bf16 or MXFP8 activations"
            return True, None

        def process_weights_after_loading(self, layer) -> None:
            qw = bf.QuantizedWeight.from_tensors(
                "MXFP4", {"weight": layer.weight.data, "weight_scale": layer.weight_scale.data.view(torch.uint8)}
            )
            activation = "bf16" if self.config.activation_quant_key is None else "mxfp8"
            _prepare(layer, qw, activation)

    return {
        "fp8": B12xCoreFp8LinearKernel,
        "fp8_block": B12xCoreFp8BlockLinearKernel,
        "mxfp8": B12xCoreMxfp8LinearKernel,
        "nvfp4": B12xCoreNvFp4LinearKernel,
        "mxfp4": B12xCoreMxFp4LinearKernel,
    }


_CANDIDATE_LISTS = {"fp8": "_POSSIBLE_FP8_KERNELS", "fp8_block": "_POSSIBLE_FP8_BLOCK_KERNELS",
                    "mxfp8": "_POSSIBLE_MXFP8_KERNELS", "nvfp4": "_POSSIBLE_NVFP4_KERNELS",
                    "mxfp4": "_POSSIBLE_MXFP4_KERNELS"}  # fmt: skip
_classes: dict[str, type] | None = None


def install() -> dict[str, type]:
    """Add the classes to vLLM's CUDA candidate lists (after the established backends, before emulation) and
    to `--linear-backend b12x`. Idempotent."""
    global _classes
    if _classes is not None:
        return _classes
    from vllm.model_executor.kernels import linear as kernels
    from vllm.platforms import PlatformEnum

    _classes = kernel_classes()
    for family, cls in _classes.items():
        candidates = getattr(kernels, _CANDIDATE_LISTS[family]).setdefault(PlatformEnum.CUDA, [])
        emulation = [i for i, c in enumerate(candidates) if c.__name__.startswith("Emulation")]
        candidates.insert(emulation[0] if emulation else len(candidates), cls)
        kernels._LINEAR_BACKEND_KERNEL_MAP.setdefault("b12x", set()).add(cls)
    return _classes
