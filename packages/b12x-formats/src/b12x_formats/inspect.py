"""`b12x-formats inspect`: per-layer format, logical shape, bytes and bits/weight of a checkpoint or .gguf.

Inspecting validates what it reports: every safetensors header (by the `safetensors` library: sizes equal
dtype × shape), every quantized layer's tensors and values, and layer shapes against config.json.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint
from .gguf_file import open_gguf
from .quantized import codec_for
from .validate import check_checkpoint


@dataclass
class Row:
    name: str  # module prefix (quantized) or tensor name
    format: str  # weight format, or the stored dtype of a floating tensor
    shape: tuple[int, ...]  # logical shape
    nbytes: int

    @property
    def params(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / max(1, self.params)


def inspect_path(path: str | Path) -> list[Row]:
    """The rows of a checkpoint directory or .gguf file, in natural order (layer 2 before layer 10)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_file() and path.suffix == ".gguf":
        return sorted(_inspect_gguf(path), key=lambda r: natural_key(r.name))
    if path.is_dir():
        return sorted(_inspect_checkpoint(path), key=lambda r: natural_key(r.name))
    raise ValueError(f"{path}: expected a checkpoint directory or a .gguf file")


def natural_key(name: str) -> tuple:
    """Sorts names with their numbers as numbers: model.layers.2 before model.layers.10."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name))


def _inspect_checkpoint(path: Path) -> list[Row]:
    ckpt = Checkpoint(path)
    check_checkpoint(ckpt)
    layers = ckpt.quantized_layers()
    rows, owned = [], set()
    for prefix, fmt in layers.items():
        spec = codec_for(fmt).spec
        names = [f"{prefix}.{t}" for t in spec.tensor_names if f"{prefix}.{t}" in ckpt.tensor_names()]
        qw = ckpt.quantized_weight(prefix, fmt)
        rows.append(Row(prefix, fmt, qw.shape, sum(ckpt.file_of(n).nbytes(n) for n in names)))
        owned.update(names)
    for name in ckpt.tensor_names():
        if name not in owned:
            f = ckpt.file_of(name)
            rows.append(Row(name, f.dtype_name(name), f.shape(name), f.nbytes(name)))
    return rows


def _inspect_gguf(path: Path) -> list[Row]:
    reader = open_gguf(path)
    return [
        Row(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)), int(t.n_bytes))
        for t in reader.tensors
    ]


def render(rows: list[Row]) -> str:
    """A plain-text table: one line per layer, then totals per format and overall."""
    width = max([len(r.name) for r in rows] + [5])
    lines = [f"{'layer':<{width}}  {'format':<12} {'shape':<22} {'bytes':>12} {'bits/w':>7}"]
    for r in rows:
        shape = "x".join(map(str, r.shape)) or "scalar"
        lines.append(f"{r.name:<{width}}  {r.format:<12} {shape:<22} {r.nbytes:>12,} {r.bits_per_weight:>7.3f}")
    by_format: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_format[r.format].append(r)
    lines.append("")
    lines.append(f"{'format':<12} {'tensors':>7} {'params':>14} {'bytes':>14} {'bits/w':>7}")
    for fmt, group in sorted(by_format.items()):
        params, nbytes = sum(r.params for r in group), sum(r.nbytes for r in group)
        lines.append(f"{fmt:<12} {len(group):>7} {params:>14,} {nbytes:>14,} {8 * nbytes / max(1, params):>7.3f}")
    params, nbytes = sum(r.params for r in rows), sum(r.nbytes for r in rows)
    lines.append(f"{'total':<12} {len(rows):>7} {params:>14,} {nbytes:>14,} {8 * nbytes / max(1, params):>7.3f}")
    return "\n".join(lines)
