"""`quantize` on a checkpoint that already holds b12x layers (a converted GGUF, an earlier quantize)."""

import hashlib

import gguf
import ml_dtypes
import numpy as np
import pytest

import b12x_formats as bf
from b12x_formats.checkpoint import Checkpoint, save_checkpoint
from b12x_formats.cli import main
from b12x_formats.example import TINY_LLAMA, llama_tensors


def digest(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def raw(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


@pytest.fixture
def mixed(tmp_path, rng):
    """A tiny Llama whose embedding is Q8_0 and whose layer-0 MLP is IQ2_XS; everything else bf16."""
    hf = tmp_path / "hf"
    save_checkpoint(hf, llama_tensors(TINY_LLAMA, seed=int(rng.integers(1 << 30))).items(), TINY_LLAMA)
    rules = ["--layer", "model.embed_tokens=Q8_0", "--layer", "model.layers.0.mlp.*=IQ2_XS"]
    assert main(["quantize", str(hf), str(tmp_path / "mixed"), *rules]) == 0  # no --default: only these
    return tmp_path / "mixed"


def test_quantize_keeps_b12x_layers_and_requantizes_only_when_asked(tmp_path, mixed, capsys):
    capsys.readouterr()
    before = digest(mixed)
    out = tmp_path / "out"
    rc = main([
        "quantize", str(mixed), str(out), "--default", "NVFP4",
        "--layer", "model.layers.0.mlp.down_proj=Q8_0",  # IQ2_XS in the input: decoded, quantized to Q8_0
        "--layer", "model.layers.0.mlp.up_proj=IQ2_XS",  # already IQ2_XS: kept as stored
        "--layer", "model.layers.1.mlp.down_proj=Q8_0",  # floating point: quantized as usual
    ])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert digest(mixed) == before  # the input is only read
    src, ck = Checkpoint(mixed), Checkpoint(out)
    layers = ck.quantized_layers()
    assert layers["model.embed_tokens"] == "Q8_0" and layers["model.layers.0.mlp.gate_proj"] == "IQ2_XS"
    assert layers["model.layers.0.self_attn.q_proj"] == "NVFP4"  # float in the input: --default applies
    assert "lm_head" not in layers  # float, and not quantized by default
    for prefix in ("model.embed_tokens", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"):
        np.testing.assert_array_equal(raw(ck.get(f"{prefix}.weight")), raw(src.get(f"{prefix}.weight")))
    # re-quantized: gguf's own IQ2_XS decode and Q8_0 encode (both bit-exact with llama.cpp) as the oracle
    iq2 = src.get("model.layers.0.mlp.down_proj.weight")
    values = gguf.quants.dequantize(iq2.reshape(iq2.shape[0], -1), gguf.GGMLQuantizationType.IQ2_XS)
    expected = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
    assert layers["model.layers.0.mlp.down_proj"] == "Q8_0"
    np.testing.assert_array_equal(raw(ck.get("model.layers.0.mlp.down_proj.weight")), raw(expected))
    # floating-point layers: as bf.quantize makes them
    w = src.get("model.layers.1.mlp.down_proj.weight").astype(np.float32)
    expected = bf.quantize(w, "Q8_0").tensors["weight"]
    np.testing.assert_array_equal(raw(ck.get("model.layers.1.mlp.down_proj.weight")), raw(expected))
    assert ck.get("model.norm.weight").dtype == ml_dtypes.bfloat16
    assert "kept byte-exact: IQ2_XS 2, Q8_0 1" in printed
    assert "model.layers.0.mlp.down_proj: IQ2_XS -> Q8_0" in printed


def test_quantize_mixed_input_errors_name_the_layer(tmp_path, mixed, capsys):
    # K of the embedding is 256, of o_proj too: make a rule whose group does not divide a quantized layer's K
    cfg = dict(TINY_LLAMA, hidden_size=160, num_attention_heads=2, num_key_value_heads=1, head_dim=80)
    save_checkpoint(tmp_path / "odd", llama_tensors(cfg).items(), cfg)
    assert main(["quantize", str(tmp_path / "odd"), str(tmp_path / "q8"), "--layer", "*.o_proj=Q8_0"]) == 0
    capsys.readouterr()
    rule = "*.0.self_attn.o_proj=IQ2_XS"
    rc = main(["quantize", str(tmp_path / "q8"), str(tmp_path / "bad"), "--default", "Q8_0", "--layer", rule])
    assert rc == 2 and not (tmp_path / "bad").exists()
    assert (
        f"--layer '{rule}': K=160 is not a multiple of 256, the group size of IQ2_XS, in "
        "model.layers.0.self_attn.o_proj; give it another format with one rule before --layer "
        f"'{rule}': --layer 'model.layers.0.self_attn.o_proj=NVFP4', or keep it as stored with --keep "
        "'model.layers.0.self_attn.o_proj'" in capsys.readouterr().err
    )
    # asking only for what the input already holds changes nothing: an error, not a silent copy
    rc = main(["quantize", str(mixed), str(tmp_path / "same"), "--layer", "model.embed_tokens=Q8_0"])
    assert rc == 2 and "nothing to quantize" in capsys.readouterr().err
