"""Hugging Face style checkpoint directories: safetensors shards + index + config.json.

Writing is atomic: everything goes into a temporary sibling directory that is renamed into place only when
complete, so a crash never leaves a half-written checkpoint and an existing one is replaced in one step.
Reading memory-maps the shards (the safetensors layout is an 8-byte header length, a JSON header and raw
little-endian data); bf16 / fp8 tensors come back as ml_dtypes arrays.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import TensorSpec, serialize_file
from tqdm.auto import tqdm

from .modelopt import QuantizationConfig, parse_quantization_config
from .quantized import QuantizedWeight, codec_for

INDEX_NAME = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 2 * 1024**3

_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E8M0": ml_dtypes.float8_e8m0fnu,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}  # fmt: skip


@contextmanager
def atomic_directory(out_dir: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes `out_dir` when the block exits without an exception."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists; pass overwrite=True (CLI: --force) to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield tmp
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "x")
            os.replace(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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


class SafetensorsFile:
    """Read-only, memory-mapped view of one .safetensors file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            self.header = json.loads(f.read(header_len))
        self.header.pop("__metadata__", None)
        self._data_start = 8 + header_len

    def keys(self) -> list[str]:
        return list(self.header)

    def dtype_name(self, name: str) -> str:
        return self.header[name]["dtype"]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def nbytes(self, name: str) -> int:
        start, end = self.header[name]["data_offsets"]
        return end - start

    def get(self, name: str) -> np.ndarray:
        info = self.header[name]
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end == start:
            return np.zeros(shape, dtype)
        raw = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self._data_start + start, shape=(end - start,))
        return raw.view(dtype).reshape(shape)


class Checkpoint:
    """A Hugging Face style checkpoint directory (one or many safetensors files, optional index)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        config_path = self.directory / "config.json"
        self.config: dict = json.loads(config_path.read_text()) if config_path.exists() else {}
        files = sorted(self.directory.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{self.directory}: no .safetensors files")
        self._files = {f.name: SafetensorsFile(f) for f in files}
        self._where = {name: f for f in self._files.values() for name in f.keys()}
        self.quantization = self._read_quantization()

    def _read_quantization(self) -> QuantizationConfig | None:
        qc = self.config.get("quantization_config")
        legacy = self.directory / "hf_quant_config.json"
        if qc is None and legacy.exists():
            qc = json.loads(legacy.read_text())
        return None if qc is None else parse_quantization_config(qc)

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
) -> Path:
    """Atomically write a checkpoint: shards + index, config.json (with `quantization_config` when given),
    hf_quant_config.json, and `extra_files` (tokenizer files etc.: bytes or a path to copy)."""
    out_dir = Path(out_dir)
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
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
