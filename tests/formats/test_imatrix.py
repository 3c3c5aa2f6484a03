"""llama.cpp importance matrices: both file formats read as llama-quantize reads them, GGUF written so that
llama.cpp's layout comes back through gguf's own reader, names mapped to HF modules, errors that name things.

The files read here are written independently of b12x: the legacy `.dat` byte by byte with struct (llama.cpp's
save_imatrix_legacy), the GGUF one with gguf.GGUFWriter the way llama-imatrix lays it out.
"""

import struct

import gguf
import numpy as np
import pytest

import b12x_formats as bf
from b12x_formats.cli import main
from b12x_formats.imatrix import ImportanceMatrix, module_importance, read_imatrix, write_imatrix

LLAMA = {"model_type": "llama", "num_hidden_layers": 2}
MOE = {"model_type": "qwen3_moe", "num_hidden_layers": 2}


def legacy_bytes(entries: dict[str, tuple[int, np.ndarray]], chunks: int | None = None, dataset: str = "") -> bytes:
    """llama.cpp's save_imatrix_legacy: name -> (ncall, values = mean(x²)·ncall)."""
    out = struct.pack("<i", len(entries))
    for name, (ncall, values) in entries.items():
        raw = name.encode()
        out += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, values.size)
        out += values.astype("<f4").tobytes()
    if chunks is not None:
        out += struct.pack("<i", chunks) + struct.pack("<i", len(dataset.encode())) + dataset.encode()
    return out


def llama_gguf(path, entries: dict[str, tuple[np.ndarray, np.ndarray]], datasets=("calib.txt",)):
    """llama-imatrix's GGUF layout: name -> (in_sum2 [nmat, K], counts [nmat])."""
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", list(datasets))
    w.add_uint32("imatrix.chunk_count", 7)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, (sums, counts) in sorted(entries.items()):
        w.add_tensor(f"{name}.in_sum2", sums.astype(np.float32))
        w.add_tensor(f"{name}.counts", counts.astype(np.float32)[:, None])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_legacy_dat_reads_as_llama_quantize_reads_it(tmp_path, rng):
    mean = {f"blk.{i}.ffn_down.weight": rng.uniform(0.01, 5, 512).astype(np.float32) for i in range(2)}
    ncall = int(rng.integers(1, 50))
    path = tmp_path / "m.dat"
    path.write_bytes(legacy_bytes({n: (ncall, m * ncall) for n, m in mean.items()}, chunks=ncall, dataset="wiki.txt"))
    matrix = read_imatrix(path)
    assert matrix.datasets == ["wiki.txt"] and matrix.chunk_count == ncall
    got = module_importance(matrix, LLAMA, {f"model.layers.{i}.mlp.down_proj": 512 for i in range(2)})
    for i in range(2):
        np.testing.assert_allclose(got[f"model.layers.{i}.mlp.down_proj"], mean[f"blk.{i}.ffn_down.weight"], rtol=1e-6)


def test_legacy_dat_without_trailer_and_expert_stacks(tmp_path, rng):
    e, k = 4, 256
    mean = rng.uniform(0.1, 3, (e, k)).astype(np.float32)
    path = tmp_path / "moe.dat"
    path.write_bytes(legacy_bytes({"blk.1.ffn_down_exps.weight": (3, mean.reshape(-1) * 3)}))
    prefixes = {f"model.layers.1.mlp.experts.{x}.down_proj": k for x in range(e)}
    got = module_importance(read_imatrix(path), MOE, prefixes)
    for x in range(e):
        np.testing.assert_allclose(got[f"model.layers.1.mlp.experts.{x}.down_proj"], mean[x], rtol=1e-6)


def test_gguf_imatrix_divides_by_counts_and_unseen_experts_read_as_ones(tmp_path, rng):
    e, k = 3, 256
    sums = rng.uniform(0, 100, (e, k)).astype(np.float32)
    counts = np.array([10, 0, 37], np.float32)  # expert 1 never reached
    dense = rng.uniform(0, 100, (1, 512)).astype(np.float32)
    path = tmp_path / "m.imatrix.gguf"
    llama_gguf(path, {"blk.0.ffn_down_exps.weight": (sums, counts), "blk.0.attn_q.weight": (dense, np.array([5.0]))})
    matrix = read_imatrix(path)
    assert matrix.datasets == ["calib.txt"] and (matrix.chunk_count, matrix.chunk_size) == (7, 512)
    got = module_importance(
        matrix,
        MOE,
        {**{f"model.layers.0.mlp.experts.{x}.down_proj": k for x in range(e)}, "model.layers.0.self_attn.q_proj": 512},
    )
    np.testing.assert_allclose(got["model.layers.0.mlp.experts.0.down_proj"], sums[0] / 10, rtol=1e-6)
    np.testing.assert_array_equal(got["model.layers.0.mlp.experts.1.down_proj"], np.ones(k, np.float32))
    np.testing.assert_allclose(got["model.layers.0.mlp.experts.2.down_proj"], sums[2] / 37, rtol=1e-6)
    np.testing.assert_allclose(got["model.layers.0.self_attn.q_proj"], dense[0] / 5, rtol=1e-6)


def test_written_gguf_has_llama_imatrix_layout(tmp_path, rng):
    sums = {
        "blk.0.ffn_down_exps.weight": rng.uniform(0, 9, (4, 256)),
        "blk.0.attn_k.weight": rng.uniform(0, 9, (1, 64)),
    }
    counts = {
        "blk.0.ffn_down_exps.weight": rng.integers(0, 99, 4).astype(np.float32),
        "blk.0.attn_k.weight": np.array([512.0]),
    }
    matrix = ImportanceMatrix(
        {n: s.astype(np.float32) for n, s in sums.items()}, counts, ["calib.txt"], chunk_count=3, chunk_size=512
    )
    path = write_imatrix(tmp_path / "out.gguf", matrix)
    reader = gguf.GGUFReader(path)  # the independent reader
    assert reader.fields["general.type"].contents() == "imatrix"
    assert "general.architecture" not in reader.fields  # llama-imatrix writes none
    assert reader.fields["imatrix.datasets"].contents() == ["calib.txt"]
    assert (
        reader.fields["imatrix.chunk_count"].contents() == 3 and reader.fields["imatrix.chunk_size"].contents() == 512
    )
    tensors = {t.name: t for t in reader.tensors}
    # llama-imatrix's order: entries sorted by name, each as in_sum2 then counts
    assert list(tensors) == [f"{n}.{part}" for n in sorted(sums) for part in ("in_sum2", "counts")]
    for name in sums:
        t = tensors[f"{name}.in_sum2"]
        # ggml order: ne = [K, nmat], as llama-imatrix's ggml_new_tensor_2d(F32, nval / nmat, nmat)
        assert (
            list(t.shape) == [sums[name].shape[1], sums[name].shape[0]]
            and t.tensor_type == gguf.GGMLQuantizationType.F32
        )
        np.testing.assert_array_equal(np.asarray(t.data).reshape(sums[name].shape), sums[name].astype(np.float32))
        c = tensors[f"{name}.counts"]
        assert list(c.shape) == [1, len(counts[name])]
        np.testing.assert_array_equal(np.asarray(c.data).reshape(-1), counts[name])
    with pytest.raises(FileExistsError, match="--force"):
        write_imatrix(path, matrix)
    assert [p.name for p in tmp_path.iterdir()] == ["out.gguf"]  # no temporary left behind


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[:-10], "ends inside"),
        (lambda b: struct.pack("<i", 0) + b[4:], "0 entries"),
        (lambda b: b"", "ends inside the entry count"),
    ],
)
def test_damaged_legacy_files_name_what_is_wrong(tmp_path, damage, message):
    path = tmp_path / "bad.dat"
    path.write_bytes(damage(legacy_bytes({"blk.0.attn_q.weight": (1, np.ones(64, np.float32))})))
    with pytest.raises(ValueError, match=message) as err:
        read_imatrix(path)
    assert str(path) in str(err.value)


def test_a_model_gguf_is_not_an_imatrix(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "model.gguf", arch="llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="not an importance matrix"):
        read_imatrix(tmp_path / "model.gguf")


def test_missing_or_misfitting_entries_name_module_and_tensor(tmp_path, rng):
    path = tmp_path / "m.gguf"
    llama_gguf(path, {"blk.0.ffn_down.weight": (rng.uniform(0, 1, (1, 512)), np.array([4.0]))})
    matrix = read_imatrix(path)
    with pytest.raises(
        ValueError, match=r"no entry for model\.layers\.1\.mlp\.down_proj \(GGUF name blk\.1\.ffn_down\.weight\)"
    ):
        module_importance(matrix, LLAMA, {"model.layers.1.mlp.down_proj": 512})
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_down\.weight is \[1 experts, 512\].*K=1024"):
        module_importance(matrix, LLAMA, {"model.layers.0.mlp.down_proj": 1024})
    with pytest.raises(ValueError, match="model_type 'nosuch'"):
        module_importance(matrix, {"model_type": "nosuch", "num_hidden_layers": 1}, {})


@pytest.fixture
def hf_dir(tmp_path):
    assert main(["example", str(tmp_path / "hf")]) == 0
    return tmp_path / "hf"


def test_quantize_with_imatrix_uses_each_layers_entry(tmp_path, hf_dir, rng):
    from b12x_formats.checkpoint import Checkpoint

    ckpt = Checkpoint(hf_dir)
    downs = [f"model.layers.{i}.mlp.down_proj" for i in range(2)]
    mean = {p: rng.uniform(0.01, 10, 512).astype(np.float32) for p in downs}
    path = tmp_path / "m.dat"
    path.write_bytes(legacy_bytes({f"blk.{i}.ffn_down.weight": (2, mean[p] * 2) for i, p in enumerate(downs)}))
    out = tmp_path / "q"
    args = ["quantize", str(hf_dir), str(out), "--default", "Q8_0", "--layer", "*.down_proj=IQ2_XS", "--jobs", "1"]
    assert main([*args, "--imatrix", str(path)]) == 0
    q = Checkpoint(out)
    for p in downs:
        w = ckpt.get(f"{p}.weight").astype(np.float32)
        expected = bf.quantize(w, "IQ2_XS", importance=mean[p]).tensors["weight"]
        np.testing.assert_array_equal(q.get(f"{p}.weight"), expected)
        assert not np.array_equal(expected, bf.quantize(w, "IQ2_XS").tensors["weight"])  # the entry mattered


def test_quantize_with_an_imatrix_missing_a_layer_fails_in_one_line(tmp_path, hf_dir, capsys):
    path = tmp_path / "m.dat"
    path.write_bytes(legacy_bytes({"blk.0.ffn_down.weight": (1, np.ones(512, np.float32))}))
    args = ["quantize", str(hf_dir), str(tmp_path / "q"), "--default", "Q8_0", "--layer", "*.down_proj=IQ2_XXS"]
    assert main([*args, "--imatrix", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "model.layers.1.mlp.down_proj" in err and "blk.1.ffn_down.weight" in err
    assert not (tmp_path / "q").exists()


@pytest.mark.slow
def test_imatrix_command_matches_activations_computed_by_hand(tmp_path, hf_dir, rng):
    """Layer 0's q/k/v see RMSNorm(embedding) of every token: computed here from the weights alone."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from b12x_formats.checkpoint import Checkpoint

    words = ["river", "bridge", "lamp", "garden", "the", "a", "slowly", "over", "quiet", "stone"]
    text = " ".join(rng.choice(words, 300))
    (tmp_path / "calib.txt").write_text(text)
    out = tmp_path / "m.gguf"
    assert main(["imatrix", str(hf_dir), "--text", str(tmp_path / "calib.txt"), "-o", str(out), "--chunk", "64"]) == 0
    matrix = read_imatrix(out)

    tok = AutoTokenizer.from_pretrained(hf_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces = [[tok.bos_token_id, *ids[i : i + 63]] for i in range(0, len(ids), 63) if len(ids[i : i + 63]) >= 16]
    flat = np.concatenate(pieces)
    ckpt = Checkpoint(hf_dir)
    emb = torch.from_numpy(ckpt.get("model.embed_tokens.weight").astype(np.float32))[flat]
    norm = torch.from_numpy(ckpt.get("model.layers.0.input_layernorm.weight").astype(np.float32))
    x = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + 1e-5) * norm
    expected = (x * x).sum(0).numpy()
    assert matrix.chunk_count == len(pieces) and matrix.chunk_size == 64
    for proj in ("attn_q", "attn_k", "attn_v"):
        np.testing.assert_allclose(matrix.sums[f"blk.0.{proj}.weight"][0], expected, rtol=1e-4)
        assert matrix.counts[f"blk.0.{proj}.weight"].tolist() == [len(flat)]
    assert {f"blk.{i}.{m}.weight" for i in range(2) for m in ("ffn_down", "ffn_up", "ffn_gate", "attn_output")} <= set(
        matrix.sums
    )
    assert "output.weight" not in matrix.sums  # the head is left out, as llama-imatrix does
    assert main(["imatrix", str(hf_dir), "--text", str(tmp_path / "calib.txt"), "-o", str(out)]) == 2  # exists
