"""Fuzzing the file readers: mutated safetensors headers, index files, quantization_config dicts and
GGUF headers, fed to the CLI as a user would.

The property, for every mutated input: the command exits 0 with exactly the tensors an independent reader
gets, or exits 2 with one `error:` line; never a traceback, never more than MEMORY_BOUND of Python memory.
The independent readers:
- safetensors headers: the `safetensors` library itself (torch front end, what vLLM loads with);
- index files and quantization_config dicts (tensor bytes untouched): the intact checkpoint's result;
- GGUF headers: exit 0 must report a self-consistent table (sizes = type × shape, within the file), and the
  intact table whenever only the metadata key/value region was mutated.
Hypothesis draws fresh cases every run (`FUZZ_EXAMPLES` scales the counts; docs/formats.md reports them).
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import struct
import tempfile
import tracemalloc
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf_fixtures import TinyModel, write_tiny_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safety_helpers import assert_clean_error, run_cli

import b12x_formats as bf
from b12x_formats.checkpoint import INDEX_NAME, save_checkpoint
from b12x_formats.inspect import natural_key
from b12x_formats.modelopt import QuantizationConfig

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402  (after the torch skip: the oracle reads through torch)

MEMORY_BOUND = 256 * 1024**2
SCALE = float(os.environ.get("FUZZ_EXAMPLES", "1"))
EXAMPLES = {"safetensors": 400, "index": 300, "quantization_config": 300, "gguf": 400}


def fuzz_settings(target: str):
    return settings(
        max_examples=max(1, int(EXAMPLES[target] * SCALE)),
        deadline=None,
        database=None,  # fresh cases every run, nothing written into the repository
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --- mutation strategies ------------------------------------------------------------------------------------

EDGE_INTS = [0, 1, -1, 2, 7, 8, 255, 2**31 - 1, 2**31, 2**32, 2**40, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64]
json_leaf = (
    st.none()
    | st.booleans()
    | st.sampled_from(EDGE_INTS)
    | st.integers(-50, 300)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
    | st.sampled_from(["F32", "BF16", "U8", "F8_E4M3", "F4", "Q8_0", "NVFP4", "W4A16_NVFP4", "nvfp4", "MXFP4",
                      "FP8", "FP8_BLOCK", "IQ2_XS", "ggml", "MIXED_PRECISION", "modelopt", "weight_map"])
)  # fmt: skip
json_value = st.recursive(
    json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=5
)


def _paths(tree, prefix=()):
    yield prefix
    children = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, value in children:
        yield from _paths(value, prefix + (key,))


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def mutate_tree(data, tree):
    """1-3 edits anywhere in a JSON tree: replace, delete, insert, or copy one node over another."""
    tree = copy.deepcopy(tree)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = list(_paths(tree))
        path = data.draw(st.sampled_from(paths))
        op = data.draw(st.sampled_from(["replace", "delete", "insert", "copy"]))
        if op == "copy":
            value = copy.deepcopy(_get(tree, data.draw(st.sampled_from(paths))))
        else:
            value = data.draw(json_value)
        node = _get(tree, path)
        if op == "insert" and isinstance(node, (dict, list)):
            if isinstance(node, dict):
                key = data.draw(st.text(max_size=8) | st.sampled_from([str(k) for k in node] or ["x"]))
                node[key] = value
            else:
                node.append(value)
        elif not path:
            tree = value
        elif op == "delete":
            parent = _get(tree, path[:-1])
            del parent[path[-1]]
        else:
            _get(tree, path[:-1])[path[-1]] = value
    return tree


def mutate_bytes(data, raw: bytes, lo: int, hi: int) -> bytes:
    """1-3 edits of raw bytes within [lo, hi): random bytes, an edge-case little-endian integer, insertion,
    deletion."""
    raw = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        hi = min(hi, len(raw))
        if hi <= lo:
            break
        at = data.draw(st.integers(lo, hi - 1))
        op = data.draw(st.sampled_from(["set", "int", "insert", "delete"]))
        if op == "set":
            raw[at] = data.draw(st.integers(0, 255))
        elif op == "int":
            width = data.draw(st.sampled_from([4, 8]))
            value = data.draw(st.sampled_from(EDGE_INTS) | st.integers(0, 2**width - 1)) % 2 ** (8 * width)
            raw[at : at + width] = value.to_bytes(width, "little")
        elif op == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del raw[at : at + data.draw(st.integers(1, 8))]
    return bytes(raw)


# --- running the CLI under watch ----------------------------------------------------------------------------


_stdout: list[str] = [""]  # the last call's standard output (gguf_table parses it)


def run_watched(capsys, *argv) -> tuple[int, str]:
    """rc and stderr of one CLI call; fails on a traceback, a messy error or too much Python memory."""
    tracemalloc.start()
    try:
        rc, out, err = run_cli(capsys, *argv)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _stdout.append(out if rc == 0 else "")
    assert peak < MEMORY_BOUND, f"{peak / 2**20:.0f} MiB"
    assert rc in (0, 2), (rc, err)
    if rc == 2:
        assert_clean_error(rc, err)
    return rc, err


def oracle_tensors(directory: Path) -> dict:
    """name -> (dtype, shape, bytes) of every tensor in every .safetensors file, read by the safetensors
    library (raises when it refuses a file)."""
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                out[name] = (
                    f.get_slice(name).get_dtype(),
                    tuple(t.shape),
                    t.reshape(-1).view(torch.uint8).numpy().tobytes(),
                )
    return out


def dequantized(capsys, src: Path, work: Path):
    """Run `dequantize src`: None when it refused (cleanly), else the tensors it wrote."""
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    rc, _ = run_watched(capsys, "dequantize", src, out)
    return oracle_tensors(out) if rc == 0 else None


# --- 1. safetensors headers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_file(tmp_path_factory):
    rng = np.random.default_rng()
    tensors = {
        "m.norm.weight": rng.standard_normal((4, 8)).astype(ml_dtypes.bfloat16),
        "m.bias": rng.standard_normal(3).astype(np.float32),
        "m.ids": rng.integers(0, 255, (2, 3), dtype=np.uint8),
        "m.codes": rng.standard_normal(4).astype(ml_dtypes.float8_e4m3fn),
        "m.scalar": np.array(0.5, np.float16),
    }
    directory = tmp_path_factory.mktemp("plain")
    save_checkpoint(directory / "ck", tensors.items(), {"model_type": "x"})
    (directory / "ck" / INDEX_NAME).unlink()  # one file, no index: the header is all that is read
    return directory / "ck"


@fuzz_settings("safetensors")
@given(data=st.data())
def test_fuzz_safetensors_header(plain_file, capsys, data):
    shard = next(plain_file.glob("*.safetensors"))
    raw = shard.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        shutil.copytree(plain_file, work / "ck")
        kind = data.draw(st.sampled_from(["tree", "bytes", "length"]))
        if kind == "tree":
            header = mutate_tree(data, json.loads(raw[8 : 8 + n]))
            text = json.dumps(header).encode()
            mutated = struct.pack("<Q", len(text)) + text + raw[8 + n :]
        elif kind == "bytes":
            mutated = mutate_bytes(data, raw, 0, 8 + n + 8)
        else:  # truncated or padded
            mutated = raw[: data.draw(st.integers(0, len(raw)))] + data.draw(st.binary(max_size=16))
        (work / "ck" / shard.name).write_bytes(mutated)
        try:
            expected = oracle_tensors(work / "ck")
        except Exception:
            expected = None
        got = dequantized(capsys, work / "ck", work)
        if expected is None:
            assert got is None, "exit 0 on a file the safetensors library refuses"
        elif got is not None:
            assert got == expected, "exit 0 with other tensors than the safetensors library reads"


# --- 2. index files -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    rng = np.random.default_rng()
    tensors = {f"m.{i}.weight": rng.standard_normal((8, 32)).astype(ml_dtypes.bfloat16) for i in range(6)}
    directory = tmp_path_factory.mktemp("sharded") / "ck"
    save_checkpoint(directory, tensors.items(), {"model_type": "x"}, max_shard_bytes=1200)
    assert len(list(directory.glob("*.safetensors"))) == 3
    return directory


@fuzz_settings("index")
@given(data=st.data())
def test_fuzz_index_file(sharded_dir, capsys, data):
    intact = oracle_tensors(sharded_dir)
    index_text = (sharded_dir / INDEX_NAME).read_text()
    shards = sorted(p.name for p in sharded_dir.glob("*.safetensors"))
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        ck = work / "ck"
        shutil.copytree(sharded_dir, ck)
        kind = data.draw(st.sampled_from(["tree", "tree", "bytes", "files"]))
        if kind == "tree":
            (ck / INDEX_NAME).write_text(json.dumps(mutate_tree(data, json.loads(index_text))))
        elif kind == "bytes":
            (ck / INDEX_NAME).write_bytes(mutate_bytes(data, index_text.encode(), 0, len(index_text)))
        else:
            victim = data.draw(st.sampled_from(shards))
            op = data.draw(st.sampled_from(["delete", "copy", "rename", "no index"]))
            if op == "delete":
                (ck / victim).unlink()
            elif op == "copy":
                shutil.copy(
                    ck / victim,
                    ck / data.draw(st.sampled_from(["extra.safetensors", "model-00004-of-00003.safetensors"])),
                )
            elif op == "rename":
                (ck / victim).rename(ck / "renamed.safetensors")
            else:
                (ck / INDEX_NAME).unlink()
        got = dequantized(capsys, ck, work)
        assert got is None or got == intact, "exit 0 with other tensors than the intact checkpoint"


# --- 3. quantization_config dicts -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quantized_dir(tmp_path_factory):
    rng = np.random.default_rng()
    formats = {"m.0.q_proj": "Q8_0", "m.0.k_proj": "NVFP4", "m.0.v_proj": "FP8", "m.0.o_proj": "MXFP4",
               "m.0.up_proj": "MXFP8", "m.0.down_proj": "FP8_BLOCK", "m.1.q_proj": "W4A16_NVFP4"}  # fmt: skip
    tensors = {"m.0.norm.weight": rng.standard_normal(64).astype(ml_dtypes.bfloat16),
               "lm_head.weight": rng.standard_normal((16, 64)).astype(ml_dtypes.bfloat16)}  # fmt: skip
    for prefix, fmt in formats.items():
        qw = bf.quantize(rng.standard_normal((16, 64)).astype(np.float32), fmt)
        tensors |= {f"{prefix}.{k}": v for k, v in qw.tensors.items()}
    directory = tmp_path_factory.mktemp("quantized") / "ck"
    save_checkpoint(directory, tensors.items(), {"model_type": "x"}, QuantizationConfig(layers=formats))
    return directory


@pytest.fixture(scope="module")
def quantized_reference(quantized_dir, tmp_path_factory):
    from b12x_formats.hf_quantize import dequantize_checkpoint

    out = tmp_path_factory.mktemp("reference") / "out"
    dequantize_checkpoint(quantized_dir, out)
    return oracle_tensors(out)


@fuzz_settings("quantization_config")
@given(data=st.data())
def test_fuzz_quantization_config(quantized_dir, quantized_reference, capsys, data):
    config = json.loads((quantized_dir / "config.json").read_text())
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        ck = work / "ck"
        shutil.copytree(quantized_dir, ck)
        if data.draw(st.booleans()):
            config["quantization_config"] = mutate_tree(data, config["quantization_config"])
        else:  # the legacy file, read when config.json has no quantization_config
            legacy = json.loads((ck / "hf_quant_config.json").read_text())
            del config["quantization_config"]
            (ck / "hf_quant_config.json").write_text(json.dumps(mutate_tree(data, legacy)))
        (ck / "config.json").write_text(json.dumps(config))
        got = dequantized(capsys, ck, work)
        assert got is None or got == quantized_reference, "exit 0 with other tensors than the intact checkpoint"


# --- 4. GGUF headers ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    model = TinyModel("llama", hidden=64, intermediate=64, layers=1, heads=2, kv_heads=1, head_dim=32, vocab=272)
    write_tiny_gguf(path, model)
    reader = gguf.GGUFReader(path)
    # magic, version, tensor count, key/value count: 24 bytes; then the key/value pairs; then the tensor table
    kv_region = (24, reader.tensors[0].field.offset)
    intact = sorted(  # in the order inspect lists them (natural: layer 2 before layer 10)
        [
            (t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)), int(t.n_bytes))
            for t in reader.tensors
        ],
        key=lambda row: natural_key(row[0]),
    )
    return path, kv_region, min(t.data_offset for t in reader.tensors), intact


def gguf_table(capsys, path) -> tuple[int, list]:
    rc, _ = run_watched(capsys, "inspect", "--json", path)
    return rc, [(r["name"], r["format"], tuple(r["shape"]), r["nbytes"]) for r in json.loads(_stdout[-1] or "[]")]


@fuzz_settings("gguf")
@given(data=st.data())
def test_fuzz_gguf_header(gguf_file, capsys, data):
    path, (kv_lo, kv_hi), data_start, intact = gguf_file
    raw = path.read_bytes()
    with tempfile.TemporaryDirectory() as work:
        mutated_path = Path(work) / "m.gguf"
        kind = data.draw(st.sampled_from(["kv", "header", "truncate"]))
        if kind == "kv":
            mutated = mutate_bytes(data, raw, kv_lo, kv_hi)
        elif kind == "header":
            mutated = mutate_bytes(data, raw, 0, data_start)
        else:
            mutated = raw[: data.draw(st.integers(0, len(raw) - 1))]
        mutated_path.write_bytes(mutated)
        rc, rows = gguf_table(capsys, mutated_path)
        if rc:
            return
        for name, fmt, shape, nbytes in rows:  # self-consistent: type x shape = bytes, all inside the file
            block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt]]
            assert nbytes == math.prod(shape) // block * block_bytes, (name, fmt, shape, nbytes)
        assert sum(r[3] for r in rows) <= len(mutated)
        if kind == "kv":  # keys and values cannot change the tensor table
            assert rows == intact
