"""The plugin's decisions, without starting an engine."""

import pytest

pytest.importorskip("vllm")

import b12x_formats as bf  # noqa: E402
import b12x_vllm  # noqa: E402
from b12x_vllm import _compat, backends, env  # noqa: E402


def mixed(fmt):
    return {
        "quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION",
        "quantized_layers": {"model.layers.0.mlp.down_proj": bf.modelopt.layer_entry(fmt)},
    }


@pytest.fixture
def config_cls(monkeypatch):
    b12x_vllm.register()
    monkeypatch.setattr(backends, "requested", {})
    from b12x_vllm.config import B12xConfig

    return B12xConfig


@pytest.mark.parametrize("fmt", ["IQ2_XS", "IQ2_XXS", "Q8_0"])
def test_ggml_checkpoints_are_always_claimed(config_cls, fmt):
    assert config_cls.override_quantization_method(mixed(fmt), None) == "b12x"


def test_other_modelopt_checkpoints_only_when_asked(config_cls, monkeypatch):
    assert config_cls.override_quantization_method(mixed("NVFP4"), None) is None
    assert config_cls.override_quantization_method(mixed("NVFP4"), "b12x") == "b12x"
    monkeypatch.setattr(backends, "requested", {"linear": "auto", "moe": "b12x"})
    assert config_cls.override_quantization_method(mixed("NVFP4"), None) == "b12x"
    assert config_cls.override_quantization_method({"quant_method": "gptq", "bits": 4}, None) is None


def test_bad_ggml_entries_are_reported(config_cls):
    cfg = mixed("IQ2_XS")
    cfg["quantized_layers"]["model.layers.0.mlp.down_proj"]["block_payload_bytes"] = 66
    with pytest.raises(ValueError, match="block_payload_bytes 66 is wrong for IQ2_XS"):
        config_cls.override_quantization_method(cfg, None)


def test_register_is_idempotent_and_hooks_engine_args_once():
    from vllm.engine.arg_utils import EngineArgs

    b12x_vllm.register()
    hook = EngineArgs.create_model_config
    b12x_vllm.register()
    backends.install_request_hook()
    assert EngineArgs.create_model_config is hook and hook._b12x_hook


def test_version_check():
    _compat.check_vllm_version("0.32.0")
    _compat.check_vllm_version("0.33.1")
    with pytest.raises(RuntimeError, match="b12x-vllm supports vLLM 0.32 and 0.33; found vLLM 0.31.2"):
        _compat.check_vllm_version("0.31.2")


def test_force_a16_env(monkeypatch):
    monkeypatch.setenv("VLLM_B12X_MOE_FP4_FORCE_A16", "1")
    assert env.moe_fp4_force_a16()
    monkeypatch.setenv("VLLM_B12X_MOE_FP4_FORCE_A16", "0")
    assert not env.moe_fp4_force_a16()
    monkeypatch.setenv("VLLM_B12X_MOE_FP4_FORCE_A16", "yes please")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        env.moe_fp4_force_a16()
