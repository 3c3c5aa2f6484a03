"""What a format is: its facts (`FormatSpec`) and the codec class that turns floats into its tensors and back.

Like gguf-py's `quants.py`, each format is one small class registered by name through `__init_subclass__`;
a codec says only how its tensors encode and decode, while `QuantizedWeight` and `api.py` handle leading
(expert) dimensions, torch inputs and validation order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

# Marker for a per-tensor scale: shape () / (1,) or one per leading index ([E] for expert stacks).
PER_TENSOR = "per-tensor"
# A size every block divides: expected shapes evaluated there show each tensor's units exactly.
PROBE = 1 << 14


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy / ml_dtypes dtype name as stored in checkpoints
    required: bool = True
    doc: str = ""


@dataclass(frozen=True)
class FormatSpec:
    """The facts of one weight format. `group_size` counts weights along K that share one scale."""

    name: str
    quant_algo: str
    group_size: int | None
    block_bytes: int | None  # bytes of one group including its scale (None when scales are not per group)
    bits_per_weight: float
    k_multiple: int  # K must be a multiple of this
    tensors: tuple[TensorSpec, ...]
    activations: tuple[str, ...]
    packing: str | None = None  # "ggml" for raw GGML blocks
    aliases: tuple[str, ...] = field(default=())
    doc: str = ""
    block_scale_code: str | None = None  # how `weight_scale` bytes encode a group's scale: "e8m0" (MX), "e4m3"
    moe_activations: tuple[str, ...] = ()  # activation formats b12x's fused MoE runs this format's experts with

    @property
    def required_tensors(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors if t.required)

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors)


class Codec:
    """Base class of every format. Subclasses set `spec` and implement the four methods below."""

    spec: ClassVar[FormatSpec]
    registry: ClassVar[dict[str, Codec]] = {}
    grid: ClassVar = None  # formats on a codebook (IQ2): a function returning it (b12x_formats.tables)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "spec" in cls.__dict__:  # abstract helpers (shared shape logic) carry no spec
            Codec.registry[cls.spec.name] = cls()

    def logical_nk(self, weight_shape: tuple[int, ...]) -> tuple[int, int]:
        """(N, K) of the unpacked matrix, from the `weight` tensor's trailing dims (leading dims excluded)."""
        raise NotImplementedError

    def expected_shapes(self, lead: tuple[int, ...], n: int, k: int) -> dict[str, tuple | str]:
        """Tensor name -> exact shape, or PER_TENSOR for scalar-or-per-leading-index scales."""
        raise NotImplementedError

    def per_tensor_names(self) -> tuple[str, ...]:
        """The format's per-tensor scales (FP8 weight_scale, NVFP4 weight_scale_2, input_scale)."""
        return tuple(name for name, shape in self.expected_shapes((), PROBE, PROBE).items() if shape == PER_TENSOR)

    def quantize(self, w: np.ndarray, importance: np.ndarray | None) -> dict[str, np.ndarray]:
        """float32 [..., N, K] -> checkpoint tensors. `importance` is float32 [..., K] or None."""
        raise NotImplementedError

    def dequantize(self, tensors: dict[str, np.ndarray], lead: tuple[int, ...], n: int, k: int) -> np.ndarray:
        """Checkpoint tensors -> float32 [..., N, K], exactly (no rounding beyond float32 products)."""
        raise NotImplementedError

    def check_values(self, tensors: dict[str, np.ndarray]) -> None:
        """Raise ValueError on data no kernel may run (NaN scales, non-finite d, reserved codes)."""


def per_tensor(values: np.ndarray, lead: tuple[int, ...]) -> np.ndarray:
    """Broadcast a scalar-or-per-leading-index scale to `lead + (1, 1)` for use against [..., N, K]."""
    values = np.asarray(values, dtype=np.float32)
    if values.size == 1:
        values = values.reshape(())
    return np.broadcast_to(values, lead).reshape(lead + (1, 1))


def repeat_groups(scales: np.ndarray, group: int, k: int) -> np.ndarray:
    """[..., N, ceil(K/group)] per-group scales -> [..., N, K]."""
    return np.repeat(scales, group, axis=-1)[..., :k]
