"""Reading the safetensors files of a checkpoint the way vLLM does: through the `safetensors` library.

`safe_open` validates each file's header before anything is read: offsets contiguous from 0, no overlaps or
gaps, every tensor's byte size equal to dtype × shape, the file covered exactly (so a truncated or padded
file is refused). Its numpy front end knows neither fp8 dtype, so the bytes are memory-mapped at the
offsets that validated layout implies (tensors packed in offset order); nothing is taken from the header
that `safe_open` has not checked.

`ShardSet` honours `model.safetensors.index.json` when present: every listed file must exist, every file
must be listed, every tensor must sit where the index says. Without an index a tensor name in two files is
refused, instead of one copy silently winning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import safe_open

INDEX_NAME = "model.safetensors.index.json"

DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E8M0": ml_dtypes.float8_e8m0fnu,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}  # fmt: skip
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def read_json(path: Path, kind: type = dict):
    """A JSON file whose top level must be `kind`; ValueError naming the file otherwise."""
    try:
        value = json.loads(Path(path).read_bytes())
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(value, kind):
        raise ValueError(f"{path}: expected a JSON {kind.__name__}, got {type(value).__name__}")
    return value


class SafetensorsFile:
    """Read-only view of one validated .safetensors file: names, dtypes, shapes, memory-mapped arrays."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            with safe_open(self.path, framework="numpy") as f:
                names = f.offset_keys()
                layout = {n: (f.get_slice(n).get_dtype(), tuple(f.get_slice(n).get_shape())) for n in names}
        except Exception as err:  # SafetensorError, OSError: the library's words, with the file named
            raise ValueError(truncation(self.path) or f"{self.path}: not a valid safetensors file: {err}") from None
        with open(self.path, "rb") as f:
            self._data_start = 8 + int.from_bytes(f.read(8), "little")
        self._info: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        offset = 0
        for name in names:  # safe_open guarantees they are packed in this order
            dtype, shape = layout[name]
            if dtype not in DTYPES:
                raise ValueError(
                    f"{self.path}: tensor {name!r} has dtype {dtype}, which b12x-formats does not read "
                    f"(known: {', '.join(DTYPES)})"
                )
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype]).itemsize
            self._info[name] = (dtype, shape, offset, nbytes)
            offset += nbytes

    def keys(self) -> list[str]:
        return list(self._info)

    def dtype(self, name: str) -> np.dtype:
        """The numpy dtype the tensor's values read as (from the header alone)."""
        return np.dtype(DTYPES[self._info[name][0]])

    def dtype_name(self, name: str) -> str:
        return self._info[name][0]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._info[name][1]

    def nbytes(self, name: str) -> int:
        return self._info[name][3]

    def get(self, name: str) -> np.ndarray:
        dtype, shape, offset, nbytes = self._info[name]
        if nbytes == 0:
            return np.zeros(shape, DTYPES[dtype])
        try:
            raw = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self._data_start + offset, shape=(nbytes,))
        except (OSError, ValueError) as err:  # e.g. the file shrank since it was validated
            raise ValueError(f"{self.path}: cannot read tensor {name!r} {list(shape)} {dtype}: {err}") from None
        return raw.view(DTYPES[dtype]).reshape(shape)


def truncation(path: Path) -> str | None:
    """Why a file `safe_open` refused is truncated, naming the first tensor whose bytes are cut off (the library
    says only "MetadataIncompleteBuffer"); None when the file is not truncated or its header does not parse."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            header_len = int.from_bytes(head, "little") if len(head) == 8 else None
            if header_len is None or 8 + header_len > size:
                return f"{path}: the file is {size} bytes, shorter than its own header: the file is truncated"
            header = json.loads(f.read(header_len))
        if not isinstance(header, dict):  # a list or null header is malformed, not truncated
            return None
        ends = sorted(
            (int(info["data_offsets"][1]), name, info)
            for name, info in header.items()
            if name != "__metadata__" and isinstance(info, dict)
        )
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    data = size - 8 - header_len
    for end, name, info in ends:
        if end > data:
            return (
                f"{path}: tensor {name!r} {info.get('shape')} {info.get('dtype')} ends at byte {8 + header_len + end} "
                f"but the file has only {size} bytes: the file is truncated (its header lists more data than it holds)"
            )
    return None


class ShardSet:
    """Every tensor of a checkpoint directory, each in exactly one file."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"{self.directory}: not a directory")
        on_disk = sorted(p.name for p in self.directory.glob("*.safetensors"))
        index_path = self.directory / INDEX_NAME
        if index_path.exists():
            weight_map = _weight_map(index_path)
            listed = sorted(set(weight_map.values()))
            for name in listed:
                if name not in on_disk:
                    example = next(t for t, f in weight_map.items() if f == name)
                    raise ValueError(
                        f"{index_path}: lists {name!r} (holding e.g. {example!r}), which is missing from "
                        f"{self.directory}; a sharded checkpoint needs every shard"
                    )
            for name in on_disk:
                if name not in set(listed):
                    raise ValueError(
                        f"{self.directory / name}: not listed in {INDEX_NAME}; a stray or stale shard "
                        "(remove it or list it in the index)"
                    )
        elif not on_disk:
            raise FileNotFoundError(f"{self.directory}: no .safetensors files")
        else:
            weight_map, listed = None, on_disk
        self.files = {name: SafetensorsFile(self.directory / name) for name in listed}
        self.where: dict[str, SafetensorsFile] = {}
        for file in self.files.values():
            for tensor in file.keys():
                if tensor in self.where:
                    raise ValueError(
                        f"tensor {tensor!r} is stored twice, in {self.where[tensor].path} and {file.path}; "
                        "a checkpoint holds each tensor once"
                    )
                self.where[tensor] = file
        if weight_map is not None:
            _check_against_index(index_path, weight_map, self.where)


def _weight_map(index_path: Path) -> dict[str, str]:
    index = read_json(index_path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index_path}: needs a non-empty 'weight_map' object (tensor name -> file name)")
    for tensor, file in weight_map.items():
        if not isinstance(file, str) or not file.endswith(".safetensors") or Path(file).name != file:
            raise ValueError(
                f"{index_path}: weight_map[{tensor!r}] = {file!r}; expected the name of a .safetensors file "
                "in the same directory"
            )
    return weight_map


def _check_against_index(index_path: Path, weight_map: dict[str, str], where: dict[str, SafetensorsFile]) -> None:
    for tensor, file in where.items():
        listed = weight_map.get(tensor)
        if listed is None:
            raise ValueError(f"{file.path}: tensor {tensor!r} is not in {index_path.name}")
        if listed != file.path.name:
            raise ValueError(f"{index_path}: puts tensor {tensor!r} in {listed!r}, but it is in {file.path.name!r}")
    for tensor, file in weight_map.items():
        if tensor not in where:
            raise ValueError(f"{index_path}: lists tensor {tensor!r} in {file!r}, which does not hold it")
