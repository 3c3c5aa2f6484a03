"""Hugging Face style checkpoint directories: safetensors shards + index + config.json.

Writing is atomic and never touches anything but the output (`output.py`); reading goes through the
`safetensors` library and honours the index (`shards.py`). bf16 / fp8 tensors come back as ml_dtypes arrays.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from safetensors import TensorSpec, serialize_file
from tqdm.auto import tqdm

from .modelopt import QuantizationConfig, parse_quantization_config
from .output import atomic_directory
from .quantized import QuantizedWeight, codec_for
from .shards import INDEX_NAME, SafetensorsFile, ShardSet, read_json  # noqa: F401  (INDEX_NAME: re-exported)

DEFAULT_SHARD_BYTES = 2 * 1024**3


def write_safetensors_shards(
    directory: Path,
    tensors: Iterable[tuple[str, np.ndarray]],
    total: int | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    desc: str = "writing",
) -> dict[str, str]:
    """Write (name, array) pairs into model-XXXXX-of-YYYYY.safetensors shards plus the index; returns the
    weight map. Arrays are materialised one shard at a time."""
    directory = Path(directory)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    weight_map: dict[str, str] = {}
    written: list[Path] = []

    def flush():
        nonlocal size
        if shards[-1]:
            path = directory / f"shard-{len(written):05d}.tmp"
            _save(shards[-1], path)
            written.append(path)
        shards[-1] = {}
        size = 0

    for name, array in tqdm(tensors, total=total, desc=desc, unit="tensor", leave=False):
        if name in weight_map:
            raise ValueError(f"duplicate tensor name {name!r}")
        array = np.require(array, requirements="C")  # (ascontiguousarray would turn 0-d scalars into 1-d)
        if size and size + array.nbytes > max_shard_bytes:
            flush()
        shards[-1][name] = array
        weight_map[name] = str(len(written))
        size += array.nbytes
    flush()
    count = len(written)
    names = [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    for path, final in zip(written, names, strict=True):
        os.replace(path, directory / final)
    weight_map = {k: names[int(v)] for k, v in weight_map.items()}
    total_size = sum((directory / n).stat().st_size for n in names)
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return weight_map


def _save(tensors: dict[str, np.ndarray], path: Path) -> None:
    # safetensors' numpy front end rejects bf16/fp8; its core takes any dtype by name.
    specs = {
        name: TensorSpec(dtype=a.dtype.name, shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
        for name, a in tensors.items()
    }
    serialize_file(specs, str(path), metadata={"format": "pt"})


class Checkpoint:
    """A Hugging Face style checkpoint directory (one or many safetensors files, optional index)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        config_path = self.directory / "config.json"
        self.config: dict = read_json(config_path) if config_path.exists() else {}
        shards = ShardSet(self.directory)
        self._files, self._where = shards.files, shards.where
        self.quantization = self._read_quantization(config_path)

    def _read_quantization(self, config_path: Path) -> QuantizationConfig | None:
        qc, source = self.config.get("quantization_config"), config_path
        legacy = self.directory / "hf_quant_config.json"
        if qc is None and legacy.exists():
            qc, source = read_json(legacy), legacy
        try:
            return None if qc is None else parse_quantization_config(qc)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None

    def tensor_names(self) -> list[str]:
        return list(self._where)

    def file_of(self, name: str) -> SafetensorsFile:
        try:
            return self._where[name]
        except KeyError:
            raise KeyError(f"{self.directory}: no tensor named {name!r}") from None

    def get(self, name: str) -> np.ndarray:
        return self.file_of(name).get(name)

    def quantized_layers(self) -> dict[str, str]:
        """Module prefix -> format for every quantized module present in the files."""
        if self.quantization is None:
            return {}
        if self.quantization.is_mixed:
            return dict(self.quantization.layers)
        prefixes = {n[: -len(".weight")] for n in self._where if n.endswith(".weight")}
        return {p: f for p in sorted(prefixes) if (f := self.quantization.format_for(p)) and self._is_linear(p)}

    def _is_linear(self, prefix: str) -> bool:
        return len(self.file_of(prefix + ".weight").shape(prefix + ".weight")) >= 2

    def quantized_weight(self, prefix: str, fmt: str | None = None) -> QuantizedWeight:
        """Assemble and validate the QuantizedWeight of module `prefix` from its checkpoint tensors."""
        fmt = fmt or self.quantized_layers().get(prefix)
        if fmt is None:
            raise KeyError(f"{self.directory}: module {prefix!r} is not quantized")
        names = codec_for(fmt).spec.tensor_names
        tensors = {n: self.get(f"{prefix}.{n}") for n in names if f"{prefix}.{n}" in self._where}
        try:
            return QuantizedWeight.from_tensors(fmt, tensors)
        except ValueError as err:
            raise ValueError(f"{self.directory}: module {prefix!r}: {err}") from None


def save_checkpoint(
    out_dir: str | os.PathLike,
    tensors: Iterable[tuple[str, np.ndarray]],
    config: dict,
    quantization: QuantizationConfig | None = None,
    extra_files: dict[str, bytes | Path] | None = None,
    total: int | None = None,
    overwrite: bool = False,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    desc: str = "writing",
    inputs: Iterable[str | os.PathLike] = (),
) -> Path:
    """Atomically write a checkpoint: shards + index, config.json (with `quantization_config` when given),
    hf_quant_config.json, and `extra_files` (tokenizer files etc.: bytes or a path to copy). `inputs`, the
    paths the tensors come from, are protected: OUT_DIR may not be, contain or sit inside one of them."""
    out_dir = Path(out_dir)
    with atomic_directory(out_dir, overwrite=overwrite, inputs=inputs) as tmp:
        write_safetensors_shards(tmp, tensors, total=total, max_shard_bytes=max_shard_bytes, desc=desc)
        config = dict(config)
        if quantization is not None:
            config["quantization_config"] = quantization.to_quantization_config()
            (tmp / "hf_quant_config.json").write_text(json.dumps(quantization.to_hf_quant_config(), indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name, content in (extra_files or {}).items():
            if isinstance(content, (bytes, str)):
                (tmp / name).write_bytes(content if isinstance(content, bytes) else content.encode())
            else:
                shutil.copyfile(content, tmp / name)
    return out_dir


def quantized_tensors(prefix: str, qw: QuantizedWeight) -> Iterator[tuple[str, np.ndarray]]:
    """Checkpoint (name, array) pairs of one quantized module."""
    for name, array in qw.tensors.items():
        yield f"{prefix}.{name}", array
