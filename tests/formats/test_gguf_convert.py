"""convert-gguf on tiny GGUF models written with gguf.GGUFWriter, checked against transformers' own GGUF loader."""

import hashlib
import json

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf_fixtures import Q, TinyModel, write_tiny_gguf

import b12x_formats as bf
from b12x_formats.checkpoint import Checkpoint
from b12x_formats.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TYPES = {
    "attn_q": Q.IQ2_XS, "attn_k": Q.IQ2_XXS, "attn_v": Q.Q4_0, "attn_output": Q.Q8_0, "ffn_gate": Q.IQ2_XS,
    "ffn_up": Q.IQ2_XS, "ffn_down": Q.Q8_0, "token_embd": Q.Q8_0, "output": Q.Q8_0,
    "ffn_gate_exps": Q.IQ2_XS, "ffn_up_exps": Q.IQ2_XS, "ffn_down_exps": Q.IQ2_XXS,
}  # fmt: skip


def reference_state(gguf_path, config_dir):
    """What transformers itself loads from the GGUF (dequantized, float32), keyed by HF name. The config is the
    converted one: transformers' GGUF config tables miss head_dim / expert width for some versions."""
    config = transformers.AutoConfig.from_pretrained(str(config_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, config=config, dtype=torch.float32
    )
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def expected_hf_tensor(ref, name, config):
    """Per-expert names are not in transformers' fused MoE parameters: slice them out."""
    if ".mlp.experts." in name:
        prefix, e, proj = name.rsplit(".", 3)[0], int(name.split(".")[-3]), name.split(".")[-2]
        inter = config["moe_intermediate_size"]
        if proj == "down_proj":
            return ref[f"{prefix}.down_proj"][e]
        fused = ref[f"{prefix}.gate_up_proj"][e]
        return fused[:inter] if proj == "gate_proj" else fused[inter:]
    return ref[name]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "qwen3moe"])
def test_convert_matches_transformers(tmp_path, arch):
    src = tmp_path / f"tiny-{arch}.gguf"
    stored = write_tiny_gguf(src, TinyModel(arch, types=TYPES), seed=int(np.random.default_rng().integers(1 << 30)))
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    out = tmp_path / "converted"
    assert main(["convert-gguf", str(src), str(out)]) == 0
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest  # input untouched

    ck = Checkpoint(out)
    config = json.loads((out / "config.json").read_text())
    model_type = {"qwen3moe": "qwen3_moe"}.get(arch, arch)
    assert config["model_type"] == model_type and config["hidden_size"] == 256 and config["num_hidden_layers"] == 2
    assert config["head_dim"] == 64 and config["num_key_value_heads"] == 2 and config["intermediate_size"] == 512
    if arch == "qwen3moe":
        assert config["moe_intermediate_size"] == 256 and config["num_experts_per_tok"] == 2

    ref = reference_state(src, out)
    layers = ck.quantized_layers()
    passthrough = {
        n
        for n, t in stored.items()
        if t.dtype == np.uint8
        and TYPES.get(n.split(".")[-2] if n.startswith("blk.") else n.split(".")[0]) in (Q.IQ2_XS, Q.IQ2_XXS, Q.Q8_0)
    }
    experts = 4 if arch == "qwen3moe" else 1
    assert len(layers) == sum(experts if "_exps" in n else 1 for n in passthrough)
    assert {"model.embed_tokens", "lm_head", "model.layers.1.self_attn.q_proj"} <= set(layers)
    for name in ck.tensor_names():
        want = expected_hf_tensor(ref, name, config)
        prefix = name.removesuffix(".weight")
        if prefix in layers:
            got = bf.dequantize(ck.quantized_weight(prefix))
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            got = ck.get(name)
            assert got.dtype == ml_dtypes.bfloat16, name
            np.testing.assert_array_equal(
                got.astype(np.float32), want.astype(ml_dtypes.bfloat16).astype(np.float32), err_msg=name
            )

    # byte for byte: the converted blocks are the GGUF's rows (llama's q/k rows only reordered)
    q_rows = stored["blk.0.attn_q.weight"]
    ours = ck.get("model.layers.0.self_attn.q_proj.weight").reshape(q_rows.shape)
    if arch == "llama":
        assert sorted(map(bytes, ours)) == sorted(map(bytes, q_rows)) and not np.array_equal(ours, q_rows)
    else:
        np.testing.assert_array_equal(ours, q_rows)
    np.testing.assert_array_equal(
        ck.get("model.embed_tokens.weight").reshape(-1), stored["token_embd.weight"].reshape(-1)
    )
    if arch == "qwen3moe":
        down = stored["blk.1.ffn_down_exps.weight"]  # [E, H, I-bytes]
        np.testing.assert_array_equal(
            ck.get("model.layers.1.mlp.experts.3.down_proj.weight").reshape(down[3].shape), down[3]
        )
        assert ck.get("model.layers.1.mlp.gate.weight").dtype == ml_dtypes.bfloat16  # the router stays floating

    tok_ours = transformers.AutoTokenizer.from_pretrained(str(out))
    tok_ref = transformers.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    text = "the cat sat in the hat"
    assert tok_ours(text)["input_ids"] == tok_ref(text)["input_ids"]


def test_convert_rejects_bad_blocks_and_leaves_nothing(tmp_path):
    src = tmp_path / "bad.gguf"
    model = TinyModel("qwen3", types={"ffn_down": Q.Q8_0})
    write_tiny_gguf(src, model)
    reader = gguf.GGUFReader(src, "r+")
    t = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    t.data[3, 34 * 2 : 34 * 2 + 2] = np.array([np.nan], np.float16).view(np.uint8)
    reader.data.flush()
    del reader
    with pytest.raises(ValueError, match="Q8_0: tensor 'weight' .*non-finite block scale d"):
        bf.gguf_convert.convert_gguf(src, tmp_path / "out")
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_convert_checks_tensors_against_the_config(tmp_path):
    src = tmp_path / "lying.gguf"
    write_tiny_gguf(src, TinyModel("qwen3", types=TYPES, metadata_intermediate=384))
    with pytest.raises(
        ValueError,
        match=r"'blk.0.ffn_gate.weight' holds \[512, 256\] per module, but the model config implies \[384, 256\]",
    ):
        bf.gguf_convert.convert_gguf(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_convert_rejects_unsupported_architecture(tmp_path, capsys):
    src = tmp_path / "phi.gguf"
    w = gguf.GGUFWriter(str(src), "phi3")
    w.add_tensor("token_embd.weight", np.ones((4, 4), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    assert main(["convert-gguf", str(src), str(tmp_path / "out")]) == 2
    assert (
        "architecture 'phi3' is not supported; supported: ('llama', 'qwen2', 'qwen3', 'qwen3moe')"
        in capsys.readouterr().err
    )


def test_inspect_gguf(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    write_tiny_gguf(src, TinyModel("qwen3moe", types=TYPES))
    assert main(["inspect", str(src)]) == 0
    out = capsys.readouterr().out
    assert "blk.0.ffn_gate_exps.weight" in out and "4x256x256" in out and "IQ2_XS" in out
