"""Checkpoint files: never lose a user's data, never load a broken checkpoint.

The tests are grouped by rule, one numbered `case` header each.
"""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf_fixtures import Q, TinyModel, write_tiny_gguf
from safety_helpers import assert_clean_error, raw_safetensors, run_cli, split_safetensors, tree_digest

import b12x_formats as bf
from b12x_formats.checkpoint import INDEX_NAME, Checkpoint, save_checkpoint
from b12x_formats.imatrix import read_imatrix
from b12x_formats.modelopt import QuantizationConfig


@pytest.fixture
def models(tmp_path, capsys):
    """models/hf: a tiny bf16 Llama checkpoint, next to a file of the user's."""
    root = tmp_path / "models"
    assert run_cli(capsys, "example", root / "hf")[0] == 0
    (root / "notes.txt").write_text("the user's own file")
    return root


@pytest.fixture
def quantized(models, capsys):
    out = models.parent / "q"
    assert run_cli(capsys, "quantize", models / "hf", out, "--default", "Q8_0")[0] == 0
    return out


# --- case 1: --force never destroys inputs or anything that is not a checkpoint -------------------------


def test_force_never_replaces_a_folder_holding_the_input(models, capsys):
    before = tree_digest(models)
    rc, _, err = run_cli(capsys, "quantize", models / "hf", models, "--default", "Q8_0", "--force")
    assert_clean_error(rc, err, "contains the input")
    assert tree_digest(models) == before


def test_force_never_replaces_the_input_itself(quantized, capsys):
    before = tree_digest(quantized)
    rc, _, err = run_cli(capsys, "dequantize", quantized, quantized, "--force")
    assert_clean_error(rc, err, "is the input")
    assert tree_digest(quantized) == before


def test_force_never_writes_inside_the_input(models, capsys):
    before = tree_digest(models / "hf")
    rc, _, err = run_cli(capsys, "quantize", models / "hf", models / "hf" / "q", "--default", "Q8_0", "--force")
    assert_clean_error(rc, err, "inside the input")
    assert tree_digest(models / "hf") == before


def test_force_never_deletes_the_gguf_it_converts(tmp_path, capsys):
    folder = tmp_path / "d"
    folder.mkdir()
    write_tiny_gguf(folder / "m.gguf", TinyModel("llama"))
    before = tree_digest(folder)
    rc, _, err = run_cli(capsys, "convert-gguf", folder / "m.gguf", folder, "--force")
    assert_clean_error(rc, err, "contains the input")
    assert tree_digest(folder) == before


def test_force_with_dot_as_output(models, capsys, monkeypatch):
    monkeypatch.chdir(models)
    before = tree_digest(models.parent)
    rc, _, err = run_cli(capsys, "quantize", "hf", ".", "--default", "Q8_0", "--force")
    assert_clean_error(rc, err, "contains the input")
    assert tree_digest(models.parent) == before  # no ..old-* / .tmp-* folders left behind


@pytest.mark.parametrize(
    "content,why",
    [
        ({"notes.txt": "x"}, "holds no .safetensors file"),
        ({"model.safetensors": "x", "sub/": None}, "not a plain file"),
        ({"model.safetensors": "x", "model.gguf": "x"}, "a GGUF file"),
        (None, "is not a directory"),
    ],
)
def test_force_replaces_only_a_checkpoint(models, capsys, content, why):
    target = models.parent / "target"
    if content is None:
        target.write_text("a file")
    else:
        target.mkdir()
        for name, text in content.items():
            (target / name).mkdir() if name.endswith("/") else (target / name).write_text(text)
    before = tree_digest(models.parent)
    rc, _, err = run_cli(capsys, "quantize", models / "hf", target, "--default", "Q8_0", "--force")
    assert_clean_error(rc, err, why, str(target))
    assert tree_digest(models.parent) == before


def test_force_replaces_a_checkpoint_or_an_empty_folder(models, quantized, capsys):
    (models.parent / "empty").mkdir()
    for target in (quantized, models.parent / "empty"):
        assert run_cli(capsys, "quantize", models / "hf", target, "--default", "FP8", "--force")[0] == 0
        assert set(Checkpoint(target).quantized_layers().values()) == {"FP8"}
    assert sorted(p.name for p in models.parent.iterdir()) == ["empty", "models", "q"]  # nothing left over


def test_force_refuses_a_symlinked_output(models, quantized, capsys):
    link = models.parent / "link"
    link.symlink_to(quantized)
    before = tree_digest(quantized)
    rc, _, err = run_cli(capsys, "quantize", models / "hf", link, "--default", "Q8_0", "--force")
    assert_clean_error(rc, err, "symbolic link")
    assert tree_digest(quantized) == before and link.is_symlink()


# --- case 2: the index is honoured ------------------------------------------------------------------------


@pytest.fixture
def sharded(tmp_path, rng):
    tensors = {f"m.{i}.weight": rng.standard_normal((16, 64)).astype(ml_dtypes.bfloat16) for i in range(6)}
    save_checkpoint(tmp_path / "sh", tensors.items(), {"model_type": "x"}, max_shard_bytes=4096)
    assert len(list((tmp_path / "sh").glob("*.safetensors"))) == 3
    return tmp_path / "sh", tensors


def test_a_missing_shard_is_refused(sharded, tmp_path, capsys):
    directory, _ = sharded
    (directory / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(ValueError, match=r"lists 'model-00002-of-00003.safetensors' .* which is missing"):
        Checkpoint(directory)
    rc, _, err = run_cli(capsys, "dequantize", directory, tmp_path / "out")
    assert_clean_error(rc, err, "model-00002-of-00003.safetensors", "missing")
    assert not (tmp_path / "out").exists()


def test_index_and_files_must_agree(sharded, rng):
    directory, tensors = sharded
    index_path = directory / INDEX_NAME
    index = json.loads(index_path.read_text())
    for entry, match in [
        ({"m.0.weight": "model-00003-of-00003.safetensors"}, r"puts tensor 'm.0.weight' in 'model-00003"),
        (
            {"ghost.weight": "model-00001-of-00003.safetensors"},
            r"lists tensor 'ghost.weight' .* which does not hold it",
        ),
        ({"m.0.weight": "../elsewhere.safetensors"}, r"expected the name of a .safetensors file"),
    ]:
        index_path.write_text(json.dumps({**index, "weight_map": {**index["weight_map"], **entry}}))
        with pytest.raises(ValueError, match=match):
            Checkpoint(directory)
    dropped = dict(index["weight_map"])
    del dropped["m.5.weight"]
    index_path.write_text(json.dumps({**index, "weight_map": dropped}))
    with pytest.raises(ValueError, match=r"tensor 'm.5.weight' is not in model.safetensors.index.json"):
        Checkpoint(directory)
    for bad in ("[]", "null", "{", '{"weight_map": []}'):
        index_path.write_text(bad)
        with pytest.raises(ValueError, match=INDEX_NAME):
            Checkpoint(directory)
    index_path.write_text(json.dumps(index))
    ck = Checkpoint(directory)  # intact again: every tensor reads back bit for bit
    for name, ref in tensors.items():
        np.testing.assert_array_equal(ck.get(name).view(np.uint16), ref.view(np.uint16))


# --- case 3: a tensor in two files is refused -------------------------------------------------------------


def test_a_tensor_in_two_files_is_refused(sharded, tmp_path, rng, capsys):
    directory, _ = sharded
    stale = {"m.2.weight": np.zeros((16, 64), ml_dtypes.bfloat16)}
    save_checkpoint(tmp_path / "stale", stale.items(), {})
    (tmp_path / "stale" / "model-00001-of-00001.safetensors").rename(directory / "extra.safetensors")
    with pytest.raises(ValueError, match=r"extra.safetensors: not listed in model.safetensors.index.json"):
        Checkpoint(directory)
    (directory / INDEX_NAME).unlink()  # without an index: the duplicate itself is named
    with pytest.raises(
        ValueError, match=r"tensor 'm.2.weight' is stored twice, in .*extra.safetensors and .*model-00002-of-00003"
    ):
        Checkpoint(directory)
    rc, _, err = run_cli(capsys, "inspect", directory)
    assert_clean_error(rc, err, "'m.2.weight' is stored twice")


# --- case 4 and 5: the safetensors library validates every header -----------------------------------------

F32x2_U8x4 = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}}  # fmt: skip
BAD_HEADERS = {  # name -> (header, data, header length or None)
    "overlap": ({**F32x2_U8x4, "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}, 8, None),
    "one-byte shift": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}, "b": {"dtype": "U8", "shape": [3], "data_offsets": [9, 12]}}, 12, None),
    "gap": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "U8", "shape": [3], "data_offsets": [9, 12]}}, 12, None),
    "negative dim": ({**F32x2_U8x4, "a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, 12, None),
    "list header": ([1, 2], 12, None),
    "null header": (None, 12, None),
    "header length 2^40": (F32x2_U8x4, 12, 2**40),
    "start > end": ({**F32x2_U8x4, "a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, 12, None),
    "negative offset": ({**F32x2_U8x4, "a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, 12, None),
    "float offset": ({**F32x2_U8x4, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8]}}, 12, None),
    "truncated": (F32x2_U8x4, 10, None),
    "trailing bytes": (F32x2_U8x4, 14, None),
    "BF16 relabelled F32": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, 4, None),  # case 11
    "4-bit dtype": ({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, 1, None),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_HEADERS)
def test_malformed_safetensors_are_refused_with_the_file_named(tmp_path, capsys, case):
    header, size, header_len = BAD_HEADERS[case]
    directory = tmp_path / "ck"
    directory.mkdir()
    raw_safetensors(directory / "model.safetensors", header, bytes(range(size)), header_len)
    with pytest.raises(ValueError, match="model.safetensors"):
        Checkpoint(directory).get("a")
    for command in (["inspect", directory], ["dequantize", directory, tmp_path / "out"]):
        rc, _, err = run_cli(capsys, *command)
        assert_clean_error(rc, err, "model.safetensors")
    assert not (tmp_path / "out").exists()


def test_intact_handmade_file_reads_exactly(tmp_path):
    """The control of the test above: the same writer, a valid header, the right bytes."""
    directory = tmp_path / "ck"
    directory.mkdir()
    raw_safetensors(directory / "model.safetensors", F32x2_U8x4, bytes(range(12)))
    ck = Checkpoint(directory)
    assert ck.get("a").tobytes() == bytes(range(8)) and ck.get("b").tolist() == [8, 9, 10, 11]


@pytest.mark.parametrize("fmt", ["MXFP4", "FP8", "NVFP4", "MXFP8"])
def test_one_dimensional_quantized_weight(rng, tmp_path, capsys, fmt):
    qw = bf.quantize(rng.standard_normal((4, 64)).astype(np.float32), fmt)
    flat = {k: (v.reshape(-1) if k == "weight" else v) for k, v in qw.tensors.items()}
    with pytest.raises(ValueError, match=rf"{fmt}: tensor 'weight' has shape \[\d+\]; it needs at least 2 dims"):
        bf.QuantizedWeight.from_tensors(fmt, flat)
    save_checkpoint(
        tmp_path / "ck", [(f"m.proj.{k}", v) for k, v in flat.items()], {}, QuantizationConfig({"m.proj": fmt})
    )
    rc, _, err = run_cli(capsys, "inspect", tmp_path / "ck")
    assert_clean_error(rc, err, "'m.proj'", "needs at least 2 dims")


@pytest.mark.parametrize(
    "config", ["[1, 2]", "null", "{nope", '{"quantization_config": [1]}', '{"quantization_config": {"quant_algo": 7}}']
)
def test_malformed_config_json(quantized, capsys, config):
    (quantized / "config.json").write_text(config)
    rc, _, err = run_cli(capsys, "inspect", quantized)
    assert_clean_error(rc, err, "config.json")


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(quantized, capsys, monkeypatch):
    from b12x_formats import inspect as inspect_module

    def broken(path):
        raise TypeError("a bug\nspanning lines")

    monkeypatch.setattr(inspect_module, "inspect_path", broken)
    rc, _, err = run_cli(capsys, "inspect", quantized)
    assert_clean_error(rc, err, "TypeError: a bug; spanning lines")
    for argv in (["--debug", "inspect", quantized], ["inspect", quantized, "--debug"]):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and "Traceback" in err and err.splitlines()[-1].endswith("TypeError: a bug; spanning lines")


# --- case 5: GGUF headers and types ------------------------------------------------------------------------


@pytest.mark.parametrize("field,offset", [("tensor count", 8), ("metadata count", 16)])
def test_gguf_counts_of_2_40(tmp_path, capsys, field, offset):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, TinyModel("llama"))
    raw = bytearray(path.read_bytes())
    raw[offset : offset + 8] = (2**40).to_bytes(8, "little")
    path.write_bytes(bytes(raw))
    for command in (["inspect", path], ["convert-gguf", path, tmp_path / "out"]):
        rc, _, err = run_cli(capsys, *command)
        assert_clean_error(rc, err, "m.gguf", "not a readable GGUF file")
    assert not (tmp_path / "out").exists()


def test_gguf_array_length_of_2_40(tmp_path, capsys):
    """A metadata array whose length field says 2^40 (its values run past the end of the file): gguf's reader reads
    past the end as empty slices, one a value, and ran out of memory in the fuzz test (24 GB); b12x's readers refuse
    the first read past the end. The CLI and the imatrix reader alike."""
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, TinyModel("llama"))
    field = gguf.GGUFReader(path).get_field("tokenizer.ggml.token_type")  # an array of int32
    length_at = field.offset + 8 + len("tokenizer.ggml.token_type") + 4 + 4  # key length, key, value type, item type
    raw = bytearray(path.read_bytes())
    assert int.from_bytes(raw[length_at : length_at + 8], "little") == len(field.data)
    raw[length_at : length_at + 8] = (2**40).to_bytes(8, "little")
    path.write_bytes(bytes(raw))
    rc, _, err = run_cli(capsys, "inspect", path)
    assert_clean_error(rc, err, "m.gguf", "not a readable GGUF file", "runs past the end of the file")
    with pytest.raises(ValueError, match="not a readable GGUF file .*runs past the end"):
        read_imatrix(path)


@pytest.mark.parametrize(
    "qtype,data",
    [
        (Q.I32, np.zeros((8, 32), np.int32)),
        (Q.F64, np.zeros((8, 32), np.float64)),
        (Q.Q8_1, np.zeros((8, gguf.GGML_QUANT_SIZES[Q.Q8_1][1]), np.uint8)),
    ],
    ids=["I32", "F64", "Q8_1"],
)
def test_gguf_types_convert_cannot_read(tmp_path, capsys, qtype, data):
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_q.weight", data, raw_dtype=qtype if qtype == Q.Q8_1 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    rc, _, err = run_cli(capsys, "convert-gguf", path, tmp_path / "out")
    assert_clean_error(rc, err, "'blk.0.attn_q.weight'", f"GGML type {qtype.name}", "cannot read")
    assert run_cli(capsys, "inspect", path)[0] == 0  # inspect only lists it: that is still true


def test_gguf_tensor_data_past_the_end_or_overlapping(tmp_path, capsys):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, TinyModel("llama"))
    reader = gguf.GGUFReader(path)
    t = reader.tensors[1]
    path.write_bytes(path.read_bytes()[: t.data_offset + 10])
    rc, _, err = run_cli(capsys, "inspect", path)
    assert_clean_error(rc, err, "m.gguf")


# --- case 7: non-finite values are refused, naming the tensor -------------------------------------------


def _poke(path, tensor_name, offset_in_tensor, value: bytes):
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == tensor_name)
    raw = bytearray(path.read_bytes())
    start = t.data_offset + offset_in_tensor
    raw[start : start + len(value)] = value
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "tensor,types,offset,value",
    [
        ("blk.0.attn_norm.weight", {}, 4 * 7, np.float32(np.nan).tobytes()),  # a NaN in an F32 norm
        ("blk.1.attn_v.weight", {"attn_v": Q.Q4_0}, 18 * 3, np.float16(np.inf).tobytes()),  # an Inf Q4_0 d
    ],
    ids=["nan-norm", "inf-q4_0-d"],
)
def test_convert_gguf_refuses_non_finite_values(tmp_path, capsys, tensor, types, offset, value):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, TinyModel("llama", types=types))
    _poke(path, tensor, offset, value)
    rc, _, err = run_cli(capsys, "convert-gguf", path, tmp_path / "out")
    assert_clean_error(rc, err, f"'{tensor}'", "weights must be finite")
    assert not (tmp_path / "out").exists()


def test_quantize_refuses_non_finite_inputs_naming_the_tensor(models, capsys):
    hf = models / "hf"
    for name in ("model.layers.1.post_attention_layernorm.weight", "model.layers.0.self_attn.q_proj.weight"):
        ck = Checkpoint(hf)
        tensors = {n: np.array(ck.get(n)) for n in ck.tensor_names()}
        tensors[name].reshape(-1)[5] = np.inf
        save_checkpoint(hf, tensors.items(), ck.config, overwrite=True)
        rc, _, err = run_cli(capsys, "quantize", hf, models.parent / "q", "--default", "Q8_0")
        assert_clean_error(rc, err, f"tensor {name!r}", "inf")
        assert not (models.parent / "q").exists()


def test_dequantize_refuses_values_that_overflow(tmp_path, capsys, rng):
    w = rng.standard_normal((4, 64)).astype(np.float32)
    huge = bf.quantize(w, "MXFP8")
    scales = np.full_like(huge.tensors["weight_scale"], 254)  # 2^127: valid E8M0, times 448 is past float32
    extreme = bf.QuantizedWeight.from_tensors("MXFP8", {**huge.tensors, "weight_scale": scales})
    with pytest.raises(ValueError, match=r"MXFP8: decoded weight \[4, 64\] holds -?inf .* overflows float32"):
        bf.dequantize(extreme)
    fp8 = bf.quantize(w, "FP8")
    near_max = bf.QuantizedWeight.from_tensors("FP8", {**fp8.tensors, "weight_scale": np.float32(3e38)})
    with pytest.raises(ValueError, match="overflows float32"):
        bf.dequantize(near_max)
    save_checkpoint(
        tmp_path / "ck",
        [(f"m.proj.{k}", v) for k, v in extreme.tensors.items()],
        {},
        QuantizationConfig({"m.proj": "MXFP8"}),
    )
    rc, _, err = run_cli(capsys, "dequantize", tmp_path / "ck", tmp_path / "out")
    assert_clean_error(rc, err, "layer 'm.proj'", "overflows float32")


# --- case 8: outputs are readable by others, as the umask says ------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_output_modes_follow_the_umask(models, capsys, umask):
    old = os.umask(umask)
    try:
        out = models.parent / "q"
        assert run_cli(capsys, "quantize", models / "hf", out, "--default", "Q8_0")[0] == 0
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
        assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
        assert set(modes.values()) == {0o666 & ~umask}, modes
        os.chmod(out, 0o755)  # --force replaces the folder: the new one follows the umask too
        assert run_cli(capsys, "quantize", models / "hf", out, "--default", "FP8", "--force")[0] == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    finally:
        os.umask(old)


# --- case 9: globs that match nothing are refused ---------------------------------------------------------


@pytest.mark.parametrize(
    "options,needle",
    [
        (["--layer", "*.down_prj=Q8_0"], "--layer '*.down_prj=Q8_0' matches no module"),
        (["--keep", "*.lm_haed"], "--keep '*.lm_haed' matches no module"),
        (["--keep", "lm_haed"], "(closest module: 'lm_head')"),
    ],
)
def test_globs_matching_nothing_are_refused(models, capsys, options, needle):
    rc, _, err = run_cli(capsys, "quantize", models / "hf", models.parent / "q", "--default", "Q8_0", *options)
    assert_clean_error(rc, err, needle)
    assert not (models.parent / "q").exists()


# --- case 10: SIGTERM cleans up; truncated files and failing layers are named ---------------------------


def test_sigterm_during_a_write_leaves_nothing_behind(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import numpy as np
        from b12x_formats.checkpoint import save_checkpoint

        def tensors():
            yield "a", np.ones(4, np.float32)
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill` would, mid-write
            yield "b", np.ones(4, np.float32)

        save_checkpoint({str(tmp_path / "ck")!r}, tensors(), {{}}, max_shard_bytes=1)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Terminated" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no .ck.tmp-* folder


def test_sigterm_through_the_cli(models, tmp_path):
    """The CLI reports it on one line and exits 128 + SIGTERM, the partial output removed."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from b12x_formats import api
        from b12x_formats.cli import main
        real = api.quantize
        def quantize_then_die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return real(*args, **kwargs)
        import b12x_formats.hf_quantize as hq
        hq.quantize = quantize_then_die
        # --jobs 1: quantize in this process, where it is patched (worker processes would not see it)
        sys.exit(main(["quantize", {str(models / "hf")!r}, {str(tmp_path / "q")!r}, "--default", "Q8_0", "--jobs", "1"]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("error: terminated by SIGTERM; nothing was written")
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]


def test_truncated_shard_names_the_file(quantized, capsys):
    shard = next(quantized.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    rc, _, err = run_cli(capsys, "inspect", quantized)
    assert_clean_error(rc, err, shard.name)


# --- case 11: inspect validates sizes and shapes against config.json ----------------------------------------


def test_inspect_refuses_a_relabelled_dtype(models, capsys):
    shard = next((models / "hf").glob("*.safetensors"))
    header, data = split_safetensors(shard)
    header["model.norm.weight"]["dtype"] = "F32"  # same offsets: 2 bytes per element claimed as 4
    raw_safetensors(shard, header, data)
    rc, _, err = run_cli(capsys, "inspect", models / "hf")
    assert_clean_error(rc, err, shard.name, "invalid shape, data type, or offset")


@pytest.mark.parametrize("key,value,layers", [
    ("intermediate_size", 768, "mlp.(gate|up|down)_proj"),
    ("num_key_value_heads", 4, "self_attn.[kv]_proj"),
    ("vocab_size", 1024, "(model.embed_tokens|lm_head)"),
])  # fmt: skip
@pytest.mark.parametrize("which", ["hf", "quantized"])
def test_inspect_checks_shapes_against_config(models, quantized, capsys, key, value, layers, which):
    directory = models / "hf" if which == "hf" else quantized
    assert run_cli(capsys, "inspect", directory)[0] == 0
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, key: value}))
    rc, _, err = run_cli(capsys, "inspect", directory)
    assert_clean_error(rc, err, "config.json implies", key)
    assert re.search(rf"layer '[\w.]*{layers}' has shape", err), err


def test_inspect_refuses_quantized_tensors_outside_quantized_layers(quantized, capsys):
    config = json.loads((quantized / "config.json").read_text())
    del config["quantization_config"]["quantized_layers"]["model.layers.0.mlp.down_proj"]
    (quantized / "config.json").write_text(json.dumps(config))
    rc, _, err = run_cli(capsys, "inspect", quantized)
    assert_clean_error(rc, err, "'model.layers.0.mlp.down_proj.weight'", "is U8", "not a quantized layer")


# --- case 12: a GGUF of F16/F32 tensors only is a plain bf16 checkpoint -------------------------------------


def test_float_only_gguf_converts_to_a_plain_checkpoint(tmp_path, capsys):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, TinyModel("llama"))  # F16 matrices, F32 norms
    out = tmp_path / "out"
    assert run_cli(capsys, "convert-gguf", path, out)[0] == 0
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and not (out / "hf_quant_config.json").exists()
    rc, report, err = run_cli(capsys, "inspect", out)
    assert rc == 0, err
    assert "BF16" in report and Checkpoint(out).quantized_layers() == {}
