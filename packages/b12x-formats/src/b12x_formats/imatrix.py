"""llama.cpp importance matrices: read both file formats, write the GGUF one, map entries to HF modules.

An importance matrix holds, for every weight a matmul multiplies, the mean square of each input channel over a
calibration text (`llama-imatrix` output; `b12x-formats imatrix` computes one, see imatrix_compute.py). IQ2
quantization weights each column's error by it. Two file formats exist:

- GGUF (`general.type = "imatrix"`): per weight `<name>.in_sum2` f32 [nmat, K] (sums of x², one row per expert)
  and `<name>.counts` f32 [nmat, 1] (tokens seen per expert), plus `imatrix.datasets`, `imatrix.chunk_count`
  and `imatrix.chunk_size`. The importance is in_sum2 / counts; a row with count 0 (an expert no token
  reached) reads as all ones, as llama-quantize does.
- legacy `.dat`: int32 entry count, then per entry int32 name length, name, int32 ncall, int32 nval,
  nval f32 values = mean(x²)·ncall; then optionally int32 chunk count, int32 length and the dataset name.
  The importance is values / ncall.

Names are GGUF tensor names (`blk.0.ffn_down.weight`); `module_importance` maps them to Hugging Face module
prefixes (`model.layers.0.mlp.down_proj`, per-expert `...mlp.experts.3.down_proj` taking row 3) through the
`gguf` package's own name tables.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_EXPERT = re.compile(r"\.experts\.(\d+)\.")


@dataclass
class ImportanceMatrix:
    """Per GGUF weight name: summed squares [nmat, K] and token counts [nmat] (nmat = experts, else 1)."""

    sums: dict[str, np.ndarray]
    counts: dict[str, np.ndarray]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0

    def importance(self, name: str) -> np.ndarray:
        """Mean squared activation [nmat, K] of `name`; rows no token reached are ones (llama-quantize's rule)."""
        sums, counts = self.sums[name], self.counts[name]
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = sums / counts[:, None]
        return np.where(counts[:, None] > 0, mean, np.float32(1)).astype(np.float32)


def read_imatrix(path: str | os.PathLike) -> ImportanceMatrix:
    """Read a llama.cpp importance matrix, GGUF or legacy `.dat` (told apart by the GGUF magic)."""
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    return _read_gguf(path) if magic == b"GGUF" else _read_legacy(path)


def _read_gguf(path: Path) -> ImportanceMatrix:
    import gguf

    from .gguf_file import checked_reader

    try:
        reader = checked_reader(path)
    except Exception as err:  # gguf raises plain ValueError/struct errors on damaged files
        raise ValueError(f"{path}: not a readable GGUF file ({err})") from err
    kind = _field(reader, "general.type")
    if kind != "imatrix":
        raise ValueError(f"{path}: a GGUF file but not an importance matrix (general.type is {kind!r})")
    sums, counts = {}, {}
    for tensor in reader.tensors:
        if tensor.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ValueError(f"{path}: tensor {tensor.name} is {tensor.tensor_type.name}; imatrix tensors are F32")
        base, _, kind = tensor.name.rpartition(".")
        data = np.array(tensor.data, np.float32)
        if kind == "in_sum2":
            sums[base] = data.reshape(-1, data.shape[-1])
        elif kind == "counts":
            counts[base] = data.reshape(-1)
    for name in sorted(sums.keys() ^ counts.keys()):
        raise ValueError(f"{path}: {name} has {'in_sum2' if name in sums else 'counts'} but not its partner tensor")
    for name, s in sums.items():
        if len(counts[name]) != len(s):
            raise ValueError(
                f"{path}: {name}.in_sum2 has {len(s)} rows but {name}.counts has {len(counts[name])}; "
                "they must agree (one per expert)"
            )
    if not sums:
        raise ValueError(f"{path}: the importance matrix has no entries")
    return ImportanceMatrix(
        sums,
        counts,
        list(_field(reader, "imatrix.datasets", [])),
        chunk_count=int(_field(reader, "imatrix.chunk_count", 0)),
        chunk_size=int(_field(reader, "imatrix.chunk_size", 0)),
    )


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


class _Legacy:
    """A cursor over a legacy `.dat` file that names the file and offset when it runs short."""

    def __init__(self, path: Path):
        self.path, self.data, self.pos = path, path.read_bytes(), 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(
                f"{self.path}: legacy imatrix ends inside {what} (offset {self.pos}, needs {n} more bytes, "
                f"file is {len(self.data)}); not a llama.cpp importance matrix, or truncated"
            )
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def int32(self, what: str) -> int:
        return struct.unpack("<i", self.take(4, what))[0]


def _read_legacy(path: Path) -> ImportanceMatrix:
    f = _Legacy(path)
    n_entries = f.int32("the entry count")
    if n_entries < 1:
        raise ValueError(f"{path}: legacy imatrix with {n_entries} entries; not a llama.cpp importance matrix")
    sums, counts = {}, {}
    for i in range(n_entries):
        name = f.take(f.int32(f"entry {i}'s name length"), f"entry {i}'s name").decode("utf-8", "replace")
        ncall = f.int32(f"{name}'s call count")
        nval = f.int32(f"{name}'s value count")
        if nval < 1:
            raise ValueError(f"{path}: entry {name} has {nval} values; every entry needs at least one")
        values = np.frombuffer(f.take(4 * nval, f"{name}'s {nval} values"), "<f4").astype(np.float32)
        # values = mean(x²)·ncall, so (values, ncall) are (sums, counts) of the same mean; experts share ncall
        sums[name], counts[name] = values[None], np.array([max(ncall, 0)], np.float32)
    chunk_count, datasets = 0, []
    if f.pos + 4 <= len(f.data):
        chunk_count = f.int32("the chunk count")
        if f.pos + 4 <= len(f.data):
            datasets = [f.take(f.int32("the dataset name length"), "the dataset name").decode("utf-8", "replace")]
    return ImportanceMatrix(sums, counts, datasets, chunk_count=chunk_count)


def write_imatrix(
    path: str | os.PathLike,
    matrix: ImportanceMatrix,
    overwrite: bool = False,
) -> Path:
    """Write `matrix` in llama.cpp's GGUF imatrix format, atomically (a temporary sibling, then a rename)."""
    import gguf

    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass --force to replace it")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # GGUFWriter opens it (with the usual mode bits)
    try:
        writer = _imatrix_writer(tmp)
        writer.add_string("general.type", "imatrix")
        writer.add_array(gguf.Keys.IMatrix.DATASETS, list(matrix.datasets))
        writer.add_uint32(gguf.Keys.IMatrix.CHUNK_COUNT, matrix.chunk_count)
        writer.add_uint32(gguf.Keys.IMatrix.CHUNK_SIZE, matrix.chunk_size)
        for name in sorted(matrix.sums):  # llama-imatrix's order, so equal inputs give equal files
            writer.add_tensor(f"{name}.in_sum2", np.ascontiguousarray(matrix.sums[name], np.float32))
            writer.add_tensor(f"{name}.counts", np.ascontiguousarray(matrix.counts[name], np.float32)[:, None])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _imatrix_writer(path):
    """A GGUFWriter without `general.architecture`: llama-imatrix writes none, an imatrix belongs to no arch."""
    import gguf

    class Writer(gguf.GGUFWriter):
        def add_architecture(self) -> None:
            pass

    return Writer(path, arch="")


def gguf_arch(model_type: str):
    """The gguf MODEL_ARCH for a config.json `model_type` (qwen3_moe -> qwen3moe); mistral is llama."""
    import gguf

    by_name = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
    for candidate in (model_type, model_type.replace("_", ""), {"mistral": "llama"}.get(model_type)):
        if candidate in by_name:
            return by_name[candidate]
    raise ValueError(f"model_type {model_type!r} has no GGUF architecture; cannot map imatrix names to its modules")


def gguf_name(tensor_map, prefix: str) -> tuple[str | None, int | None]:
    """HF module prefix -> (GGUF weight name, expert index or None); (None, None) when gguf has no name."""
    expert = _EXPERT.search(prefix)
    stacked = _EXPERT.sub(".experts.", prefix) if expert else prefix
    name = tensor_map.get_name(stacked + ".weight", try_suffixes=(".weight",))
    return name, (int(expert.group(1)) if expert else None)


def module_importance(matrix: ImportanceMatrix, config: dict, prefixes: dict[str, int], path: str = "imatrix"):
    """Importance [K] for each HF module prefix in `prefixes` (prefix -> its weight's K).

    Raises ValueError naming the module and the GGUF name when the matrix has no entry for one, or when the
    entry's width or expert count does not fit the weight.
    """
    import gguf

    tensor_map = gguf.get_tensor_name_map(gguf_arch(config.get("model_type", "")), config["num_hidden_layers"])
    out = {}
    for prefix, k in prefixes.items():
        name, expert = gguf_name(tensor_map, prefix)
        if name is None or name not in matrix.sums:
            raise ValueError(
                f"{path} has no entry for {prefix}" + (f" (GGUF name {name})" if name else " (no GGUF name for it)")
                + "; IQ2 needs an importance for every layer it quantizes: use an imatrix of this model, or "
                "quantize this layer to another format with --layer"
            )  # fmt: skip
        imp = matrix.importance(name)
        if len(imp) == 1 and expert is not None and imp.shape[1] % k == 0:
            imp = imp.reshape(-1, k)  # a legacy .dat stores an expert stack as one row of E·K values
        row = 0 if expert is None else expert
        if imp.shape[1] != k or row >= len(imp) or (expert is None and len(imp) != 1):
            raise ValueError(
                f"{path}: entry {name} is [{len(imp)} experts, {imp.shape[1]}] but {prefix} needs "
                f"{'expert ' + str(expert) + ' of ' if expert is not None else ''}width K={k}"
            )
        out[prefix] = imp[row]
    return out
