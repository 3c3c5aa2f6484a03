"""ModelOpt quantization configs: entries, both config forms, fused shards, experts, errors."""

import pytest

import b12x_formats as bf
from b12x_formats.modelopt import QuantizationConfig, parse_quantization_config

GGML_ENTRIES = {
    "IQ2_XS": {"quant_algo": "IQ2_XS", "group_size": 256, "block_payload_bytes": 74, "packing": "ggml"},
    "IQ2_XXS": {"quant_algo": "IQ2_XXS", "group_size": 256, "block_payload_bytes": 66, "packing": "ggml"},
    "Q8_0": {"quant_algo": "Q8_0", "group_size": 32, "block_payload_bytes": 34, "packing": "ggml"},
}


@pytest.mark.parametrize("fmt", list(GGML_ENTRIES))
def test_layer_entry_ggml_exact(fmt):
    assert bf.modelopt.layer_entry(fmt) == GGML_ENTRIES[fmt]
    assert bf.modelopt.layer_entry(fmt.lower()) == GGML_ENTRIES[fmt]


@pytest.mark.parametrize("fmt", bf.FORMATS)
def test_layer_entry_has_exactly_four_keys_and_round_trips(fmt):
    entry = bf.modelopt.layer_entry(fmt)
    assert set(entry) == {"quant_algo", "group_size", "block_payload_bytes", "packing"}
    cfg = parse_quantization_config(
        {
            "quant_method": "modelopt",
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {"model.layers.0.mlp.down_proj": entry},
        }
    )
    assert cfg.format_for("model.layers.0.mlp.down_proj") == fmt


def mixed(layers):
    return {
        "quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION",
        "kv_cache_quant_algo": None,
        "quantized_layers": layers,
    }


def test_config_json_and_hf_quant_config_forms_agree():
    layers = {
        "model.layers.0.self_attn.q_proj": GGML_ENTRIES["IQ2_XS"],
        "model.layers.0.self_attn.k_proj": GGML_ENTRIES["IQ2_XS"],
        "model.layers.0.self_attn.v_proj": GGML_ENTRIES["IQ2_XS"],
        "model.layers.0.self_attn.o_proj": {"quant_algo": "NVFP4", "group_size": 16},
        "model.layers.0.mlp.gate_proj": {"quant_algo": "FP8"},
        "model.layers.0.mlp.up_proj": {"quant_algo": "FP8"},
        "model.embed_tokens": GGML_ENTRIES["Q8_0"],
    }
    a = parse_quantization_config(mixed(layers))
    b = parse_quantization_config({"producer": {"name": "modelopt", "version": "0.40"}, "quantization": mixed(layers)})
    assert a.layers == b.layers and b.producer["name"] == "modelopt"
    assert a.format_for("model.layers.0.self_attn.qkv_proj") == "IQ2_XS"
    assert a.format_for("model.layers.0.mlp.gate_up_proj") == "FP8"
    assert a.format_for("model.layers.0.self_attn.o_proj") == "NVFP4"
    assert a.format_for("model.embed_tokens") == "Q8_0"
    assert a.format_for("lm_head") is None
    # what we write parses back to the same thing
    assert parse_quantization_config(a.to_quantization_config()).layers == a.layers
    assert parse_quantization_config(a.to_hf_quant_config()).layers == a.layers


def test_fused_shards_must_agree():
    cfg = parse_quantization_config(
        mixed({"m.layers.0.mlp.gate_proj": GGML_ENTRIES["IQ2_XS"], "m.layers.0.mlp.up_proj": GGML_ENTRIES["Q8_0"]})
    )
    with pytest.raises(
        ValueError, match="gate_up_proj: fused shards must share one format.*gate_proj=IQ2_XS.*up_proj=Q8_0"
    ):
        cfg.format_for("m.layers.0.mlp.gate_up_proj")
    partial = parse_quantization_config(mixed({"m.layers.0.self_attn.q_proj": GGML_ENTRIES["Q8_0"]}))
    with pytest.raises(ValueError, match="qkv_proj: fused shards must share one format"):
        partial.format_for("m.layers.0.self_attn.qkv_proj")


def test_moe_experts_resolve_per_projection():
    layers = {}
    for e in range(4):
        for proj, fmt in (("gate_proj", "IQ2_XS"), ("up_proj", "IQ2_XS"), ("down_proj", "Q8_0")):
            layers[f"model.layers.3.mlp.experts.{e}.{proj}"] = GGML_ENTRIES[fmt]
    cfg = parse_quantization_config(mixed(layers))
    assert cfg.moe_formats("model.layers.3.mlp.experts", 4) == {"w13": "IQ2_XS", "w2": "Q8_0"}
    assert cfg.format_for("model.layers.3.mlp.experts.2.down_proj") == "Q8_0"
    layers["model.layers.3.mlp.experts.2.up_proj"] = GGML_ENTRIES["IQ2_XXS"]
    with pytest.raises(ValueError, match=r"experts \(w13\): fused shards must share one format"):
        parse_quantization_config(mixed(layers)).moe_formats("model.layers.3.mlp.experts", 4)


def test_single_format_configs():
    cfg = parse_quantization_config(
        {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "group_size": 16,
            "exclude_modules": ["lm_head", "model.layers.0.mlp*"],
        }
    )
    assert cfg.format_for("model.layers.1.self_attn.o_proj") == "NVFP4"
    assert cfg.format_for("lm_head") is None
    assert cfg.format_for("model.layers.0.mlp.down_proj") is None
    legacy = parse_quantization_config(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "exclude_modules": []}}
    )
    assert legacy.format_for("model.layers.0.mlp.gate_up_proj") == "FP8"
    assert parse_quantization_config({"quant_method": "modelopt", "quant_algo": "FP8_PB_WO"}).default == "FP8_BLOCK"


@pytest.mark.parametrize(
    "entry,message",
    [
        ({"quant_algo": "IQ2_XS", "group_size": 256, "block_payload_bytes": 66, "packing": "ggml"}, "block_payload_bytes 66 is wrong for IQ2_XS.*74 bytes"),
        ({"quant_algo": "IQ2_XXS", "group_size": 128, "block_payload_bytes": 66, "packing": "ggml"}, "group_size 128 is wrong for IQ2_XXS; IQ2_XXS uses 256"),
        ({"quant_algo": "Q8_0", "group_size": 32, "block_payload_bytes": 34, "packing": "gguf"}, "needs packing: 'ggml', got 'gguf'"),
        ({"quant_algo": "Q8_0", "group_size": 32, "block_payload_bytes": 34}, "needs packing: 'ggml', got None"),
        ({"quant_algo": "NVFP4", "group_size": 32}, "group_size 32 is wrong for NVFP4"),
        ({"quant_algo": "NVFP4", "group_size": 16, "packing": "ggml"}, "packing 'ggml' applies only to GGML block formats"),
        ({"quant_algo": "EXL3"}, "unknown weight format 'EXL3'"),
        ({"quant_algo": "FP8", "bits": 8}, r"unknown key\(s\) \['bits'\]"),
        ("FP8", "expected a dict with 'quant_algo'"),
    ],
)  # fmt: skip
def test_bad_entries(entry, message):
    with pytest.raises(ValueError, match=rf"quantized_layers\['model.layers.0.mlp.down_proj'\]: .*{message}"):
        parse_quantization_config(mixed({"model.layers.0.mlp.down_proj": entry}))


@pytest.mark.parametrize(
    "norm", ["model.layers.0.input_layernorm", "model.norm", "model.layers.2.self_attn.q_norm", "transformer.ln_f"]
)
def test_norms_must_not_be_quantized(norm):
    with pytest.raises(ValueError, match=f"{norm} is a normalisation layer; norms stay floating point"):
        parse_quantization_config(mixed({norm: GGML_ENTRIES["Q8_0"]}))


def test_bad_configs():
    with pytest.raises(ValueError, match="quant_method 'gptq' is not a ModelOpt config"):
        parse_quantization_config({"quant_method": "gptq", "bits": 4})
    with pytest.raises(ValueError, match="no 'quant_algo'"):
        parse_quantization_config({"quant_method": "modelopt"})
    with pytest.raises(ValueError, match="non-empty 'quantized_layers'"):
        parse_quantization_config({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"})
    with pytest.raises(ValueError, match="only supported inside MIXED_PRECISION"):
        parse_quantization_config({"quant_method": "modelopt", "quant_algo": "IQ2_XS"})


def test_written_config_is_modelopt_shaped():
    qc = QuantizationConfig(layers={"model.layers.0.mlp.down_proj": "IQ2_XXS"}).to_quantization_config()
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == "MIXED_PRECISION"
    assert qc["quantized_layers"]["model.layers.0.mlp.down_proj"] == GGML_ENTRIES["IQ2_XXS"]
    assert qc["producer"]["name"] == "b12x-formats"
