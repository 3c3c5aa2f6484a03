"""Checkpoint directories: round trip, shards + index, atomic writes, the quantize CLI."""

import hashlib
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import b12x_formats as bf
from b12x_formats import checkpoint
from b12x_formats.checkpoint import Checkpoint, save_checkpoint
from b12x_formats.cli import main
from b12x_formats.example import TINY_LLAMA, llama_tensors


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_round_trip_every_dtype_and_shards(tmp_path, rng):
    tensors = {
        "a.bf16": rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16),
        "b.f32": rng.standard_normal(17).astype(np.float32),
        "c.scalar": np.array(0.5, np.float32),
        "d.fp8": bf.quantize(rng.standard_normal((8, 32)).astype(np.float32), "FP8").tensors["weight"],
        "e.u8": rng.integers(0, 255, size=(3, 4, 74), dtype=np.uint8),
        "f.f16": rng.standard_normal((5, 5)).astype(np.float16),
    }
    save_checkpoint(tmp_path / "ck", tensors.items(), {"model_type": "x"}, max_shard_bytes=4096)
    files = sorted(p.name for p in (tmp_path / "ck").glob("*.safetensors"))
    assert len(files) >= 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((tmp_path / "ck" / checkpoint.INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(tensors) and set(index["weight_map"].values()) == set(files)
    ck = Checkpoint(tmp_path / "ck")
    for name, ref in tensors.items():
        got = ck.get(name)
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), ref.reshape(-1).view(np.uint8))


def test_safetensors_files_load_in_torch(tmp_path, rng):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    w = bf.quantize(rng.standard_normal((8, 32)).astype(np.float32), "NVFP4")
    save_checkpoint(tmp_path / "ck", [(f"m.{k}", v) for k, v in w.tensors.items()], {})
    loaded = load_file(next((tmp_path / "ck").glob("*.safetensors")))
    assert loaded["m.weight_scale"].dtype == torch.float8_e4m3fn and loaded["m.weight"].dtype == torch.uint8
    assert loaded["m.weight_scale_2"].shape == ()


def test_write_is_atomic(tmp_path, rng):
    out = tmp_path / "ck"
    save_checkpoint(out, [("x", np.ones(3, np.float32))], {"v": 1})
    before = digest(out)

    def failing():
        yield "x", np.zeros(3, np.float32)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        save_checkpoint(out, failing(), {"v": 2}, overwrite=True)
    assert digest(out) == before  # the old checkpoint is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no temporary directory left behind
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_checkpoint(out, [("x", np.ones(3, np.float32))], {})
    save_checkpoint(out, [("y", np.ones(2, np.float32))], {"v": 3}, overwrite=True)
    assert Checkpoint(out).tensor_names() == ["y"] and [p.name for p in tmp_path.iterdir()] == ["ck"]


@pytest.fixture
def hf_dir(tmp_path):
    assert main(["example", str(tmp_path / "hf")]) == 0
    (tmp_path / "hf" / "tokenizer.json").write_text("{}")
    return tmp_path / "hf"


def test_quantize_cli(tmp_path, hf_dir, capsys):
    before = digest(hf_dir)
    out = tmp_path / "q"
    rc = main([
        "quantize", str(hf_dir), str(out), "--default", "IQ2_XS",
        "--layer", "*.mlp.down_proj=Q8_0", "--layer", "*.self_attn.o_proj=NVFP4", "--layer", "*.v_proj=fp8",
        "--layer", "model.embed_tokens=Q8_0", "--keep", "model.layers.1.mlp.*",
    ])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert digest(hf_dir) == before  # the input is never modified
    ck = Checkpoint(out)
    assert (out / "tokenizer.json").exists() and (out / "hf_quant_config.json").exists()
    layers = ck.quantized_layers()
    assert layers["model.layers.0.mlp.down_proj"] == "Q8_0"
    assert layers["model.layers.0.mlp.gate_proj"] == "IQ2_XS"  # --default
    assert layers["model.layers.0.self_attn.o_proj"] == "NVFP4"
    assert layers["model.layers.1.self_attn.v_proj"] == "FP8"
    assert layers["model.embed_tokens"] == "Q8_0"
    assert "model.layers.1.mlp.down_proj" not in layers  # --keep wins over --layer
    assert "lm_head" not in layers  # not quantized by default
    src = Checkpoint(hf_dir)
    for name in (
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "lm_head.weight",
        "model.layers.1.mlp.down_proj.weight",
    ):
        assert ck.get(name).dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(ck.get(name).view(np.uint16), src.get(name).view(np.uint16))
    # each quantized module equals bf.quantize of the source weight
    for prefix, fmt in layers.items():
        expected = bf.quantize(src.get(prefix + ".weight").astype(np.float32), fmt)
        got = ck.quantized_weight(prefix)
        for tname, t in expected.tensors.items():
            np.testing.assert_array_equal(
                np.asarray(got.tensors[tname]).reshape(-1).view(np.uint8), np.asarray(t).reshape(-1).view(np.uint8)
            )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["quantization_config"]["quant_algo"] == "MIXED_PRECISION"

    assert main(["inspect", str(out)]) == 0
    report = capsys.readouterr().out
    assert "model.layers.0.mlp.gate_proj" in report and "IQ2_XS" in report and "2.312" in report
    assert main(["inspect", "--json", str(out)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["format"] for r in rows} >= {"IQ2_XS", "Q8_0", "NVFP4", "FP8", "BF16"}


def test_quantize_cli_errors(tmp_path, hf_dir, capsys):
    assert main(["quantize", str(hf_dir), str(tmp_path / "q"), "--default", "IQ2_XS", "--layer", "*.down_proj"]) == 2
    assert "expected GLOB=FORMAT" in capsys.readouterr().err
    assert main(["quantize", str(hf_dir), str(tmp_path / "q"), "--default", "Q4_K"]) == 2
    assert "unknown weight format 'Q4_K'" in capsys.readouterr().err
    assert main(["quantize", str(hf_dir), str(hf_dir), "--default", "Q8_0"]) == 2
    assert "must differ" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()
    # K of o_proj is 256: fine for every format; make a layer whose K breaks IQ2's group of 256
    cfg = dict(TINY_LLAMA, hidden_size=160, num_attention_heads=2, num_key_value_heads=1, head_dim=80)
    save_checkpoint(tmp_path / "odd", llama_tensors(cfg).items(), cfg)
    assert main(["quantize", str(tmp_path / "odd"), str(tmp_path / "q2"), "--default", "IQ2_XXS"]) == 2
    assert "K=160 is not a multiple of 256" in capsys.readouterr().err
    assert not (tmp_path / "q2").exists()


def test_checkpoint_rejects_corrupt_quantized_layer(tmp_path, rng):
    qw = bf.quantize(rng.standard_normal((8, 256)).astype(np.float32), "IQ2_XXS")
    blocks = qw.tensors["weight"].copy()
    blocks[2, 0, :2] = np.array([np.inf], np.float16).view(np.uint8)
    quant = bf.modelopt.QuantizationConfig(layers={"m.proj": "IQ2_XXS"})
    save_checkpoint(tmp_path / "ck", [("m.proj.weight", blocks)], {}, quant)
    with pytest.raises(ValueError, match=r"module 'm.proj': IQ2_XXS: tensor 'weight' .*non-finite block scale d"):
        Checkpoint(tmp_path / "ck").quantized_weight("m.proj")


def test_quantize_plan_leaves_norms_biases_routers_embeddings_alone():
    from b12x_formats.hf_quantize import QuantizePlan

    plan = QuantizePlan.from_cli("IQ2_XS", ["model.embed_tokens=Q8_0", "*.mlp.gate=Q8_0"], ["*.o_proj"])
    assert plan.format_for("model.layers.0.mlp.experts.3.up_proj", (512, 256)) == "IQ2_XS"
    assert plan.format_for("model.layers.0.mlp.shared_expert.down_proj", (256, 512)) == "IQ2_XS"
    assert plan.format_for("model.layers.0.self_attn.o_proj", (256, 256)) is None  # --keep
    assert plan.format_for("model.embed_tokens", (512, 256)) == "Q8_0"  # only when a --layer names it
    assert plan.format_for("lm_head", (512, 256)) is None
    assert plan.format_for("model.layers.1.mlp.gate", (8, 256)) == "Q8_0"  # named: the rule wins
    bare = QuantizePlan.from_cli("Q8_0", [], [])
    assert bare.format_for("model.layers.1.mlp.gate", (8, 256)) is None  # MoE router
    assert bare.format_for("model.layers.1.mlp.shared_expert_gate", (1, 256)) is None
    assert bare.format_for("model.layers.1.post_attention_layernorm", (256, 256)) is None  # norms never
    assert bare.format_for("model.layers.1.self_attn.q_proj", (256,)) is None  # 1-D (biases are never .weight)
