"""`QuantizedWeight`: a format name, the logical [..., N, K] shape, and checkpoint-named numpy tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._arrays import dtype_name, to_numpy
from .spec import PER_TENSOR, Codec, FormatSpec


def codec_for(name: str) -> Codec:
    """The codec of a format name or alias, case-insensitive; ValueError listing the known names."""
    from . import codecs  # noqa: F401  (registers every codec)

    key = str(name).upper()
    for codec in Codec.registry.values():
        if key == codec.spec.name or key in codec.spec.aliases:
            return codec
    raise ValueError(f"unknown weight format {name!r}; known formats: {', '.join(Codec.registry)}")


@dataclass(frozen=True)
class QuantizedWeight:
    format: str
    shape: tuple[int, ...]  # logical [..., N, K]
    tensors: dict[str, np.ndarray] = field(repr=False)

    @property
    def spec(self) -> FormatSpec:
        return codec_for(self.format).spec

    @property
    def nbytes(self) -> int:
        return sum(int(t.nbytes) for t in self.tensors.values())

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / max(1, int(np.prod(self.shape)))

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}: {dtype_name(v.dtype)}{list(v.shape)}" for k, v in self.tensors.items())
        return f"QuantizedWeight({self.format}, shape={list(self.shape)}, {parts})"

    @classmethod
    def from_tensors(cls, fmt: str, tensors: dict) -> QuantizedWeight:
        """Validate checkpoint tensors (numpy or torch) of `fmt` and wrap them. Raises ValueError naming the
        tensor, its shape or dtype, and the rule it breaks."""
        codec = codec_for(fmt)
        arrays = {name: to_numpy(value) for name, value in tensors.items()}
        shape = check_layout(fmt, {name: (dtype_name(a.dtype), tuple(a.shape)) for name, a in arrays.items()})
        codec.check_values(arrays)
        return cls(codec.spec.name, shape, arrays)


def check_layout(fmt: str, layout: dict[str, tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    """Check the names, dtypes and shapes of a format's tensors (name -> (dtype name, shape)), as a checkpoint's
    headers give them, without reading any data; returns the logical [..., N, K] shape. Raises ValueError naming
    the tensor, its shape or dtype, and the rule it breaks (from_tensors' checks before the values')."""
    codec = codec_for(fmt)
    spec = codec.spec
    unknown = sorted(set(layout) - set(spec.tensor_names))
    if unknown:
        raise ValueError(f"{spec.name}: unexpected tensor(s) {unknown}; {spec.name} stores {list(spec.tensor_names)}")
    missing = [n for n in spec.required_tensors if n not in layout]
    if missing:
        raise ValueError(
            f"{spec.name}: missing tensor(s) {missing}; {spec.name} requires {list(spec.required_tensors)}"
        )
    for tspec in spec.tensors:
        if tspec.name in layout and layout[tspec.name][0] != tspec.dtype:
            dtype, shape = layout[tspec.name]
            raise ValueError(
                f"{spec.name}: tensor '{tspec.name}' {list(shape)} has dtype {dtype}; expected {tspec.dtype} "
                f"({tspec.doc})"
            )
    weight = tuple(layout["weight"][1])
    min_dims = 3 if spec.packing == "ggml" else 2
    if len(weight) < min_dims:
        if spec.packing == "ggml":
            codec.logical_nk(weight)  # raises the block format's own message
        raise ValueError(
            f"{spec.name}: tensor 'weight' has shape {list(weight)}; it needs at least {min_dims} dims ([..., N, K])"
        )
    n, k = codec.logical_nk(weight)
    lead = weight[: len(weight) - min_dims]
    if k % spec.k_multiple:
        raise ValueError(f"{spec.name}: K={k} is not a multiple of {spec.k_multiple}")
    for name, expected in codec.expected_shapes(lead, n, k).items():
        if name not in layout:
            continue
        got = tuple(layout[name][1])
        if expected == PER_TENSOR:
            if int(np.prod(got)) != 1 and got != lead:
                raise ValueError(
                    f"{spec.name}: tensor '{name}' has shape {list(got)}; expected one scalar or one value per "
                    f"leading index {list(lead)} of weight {list(weight)}"
                )
        elif got != expected:
            raise ValueError(
                f"{spec.name}: tensor '{name}' has shape {list(got)}; expected {list(expected)} for a "
                f"{list(lead + (n, k))} weight ({next(t.doc for t in spec.tensors if t.name == name)})"
            )
    return lead + (n, k)
