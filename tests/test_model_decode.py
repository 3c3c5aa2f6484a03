"""benchmarks/model_decode.py on the CPU: its tiny models step through the reference path (bf16 and b12x linears,
the MoE both ways), and --from-json prints the table and draws the plot of a saved run."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules

import model_decode as md  # noqa: E402

# K of every projection a multiple of 256 (IQ2's group): hidden 256, 4 heads of 64, intermediate 256
TINY = md.Arch("tiny", 256, 2, 4, 2, 64, 256, 512)
TINY_MOE = md.Arch("tiny_moe", 256, 1, 4, 2, 64, 256, 512, experts=8, top_k=2, qk_norm=True)


@pytest.mark.parametrize(
    ("arch", "fmt", "activations"),
    [(TINY, "bf16", "bf16"), (TINY, "IQ2_XS", "bf16"), (TINY, "FP8", "fp8_token"), (TINY_MOE, "NVFP4", "bf16 moe bf16"),
     (TINY, "FP8+input_scale", "fp8_static"), (TINY, "NVFP4+input_scale", "nvfp4"), (TINY_MOE, "bf16", "bf16"),
     (replace(TINY, layers=0), "bf16", "bf16")],
)  # fmt: skip
def test_a_tiny_model_steps_on_the_cpu(arch, fmt, activations):
    torch.manual_seed(0)
    model = md.Model(arch, fmt, device="cpu", max_tokens=4)
    with torch.no_grad():
        logits = model(torch.tensor([1, 5, 7]))
    assert logits.shape == (3, arch.vocab) and logits.dtype == torch.bfloat16
    assert torch.isfinite(logits).all()
    assert model.activations() == activations


def saved_run() -> dict:
    rows = [dict(model=m, layers=2, format=f, activation="bf16", batch=b, step_us=100.0 * b, tokens_per_s=1e4,
                 bf16_step_us=200.0 * b, bf16_tokens_per_s=5e3, speedup=2.0, head_us=20.0, layer_us=40.0 * b,
                 bf16_layer_us=90.0 * b, build_s=1.0)
            for m, f in (("llama8b", "NVFP4"), ("llama8b", "FP8"), ("qwen3moe", "IQ2_XS")) for b in (1, 4, 16)]  # fmt: skip
    return {"device": "NVIDIA H200", "capability": [9, 0], "date": "2026-01-01", "ctx": 512, "rows": rows}


def test_from_json_prints_the_table(tmp_path, capsys):
    (tmp_path / "run.json").write_text(json.dumps(saved_run()))
    md.main(["--from-json", str(tmp_path / "run.json"), "--png", ""])
    table = capsys.readouterr().out
    assert (
        table.count("\n| llama8b | 2 | NVFP4 | bf16 |") == 3
        and "| 16 | 1600 | 10000 | 3200 | 5000 | 2.00× | 640.0 | 1440.0 |" in table
    )


def test_from_json_draws_the_plot(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "run.json").write_text(json.dumps(saved_run()))
    md.main(["--from-json", str(tmp_path / "run.json"), "--png", str(tmp_path / "run.png")])
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_decode_kernels_attributes_each_kernel_to_a_layer():
    import decode_kernels as dk

    head = {"step_us": 40.0, "kernels": {"embed": (1.0, 5.0), "lm_head": (1.0, 20.0)}}
    row = {"step_us": 240.0, "kernels": {"embed": (1.0, 5.0), "lm_head": (1.0, 20.0), "gemm": (8.0, 120.0),
                                         "norm": (4.0, 40.0)}}  # fmt: skip
    kernels, total, graph = dk.per_layer(row, head, layers=4)
    assert sorted(kernels) == [("gemm", 2.0, 30.0), ("norm", 1.0, 10.0)]
    assert (total, graph) == (40.0, 50.0)  # 10 µs a layer between kernels
    saved = {"model": "llama8b", "batch": 1, "layers": 4, "head": head, "formats": {"NVFP4": row}}
    text = dk.table(saved)
    assert "graph 50.0 µs/layer, kernels 40.0 µs/layer (3 launches), between them 10.0 µs" in text
    assert text.index("`gemm`") < text.index("`norm`")  # the costliest first
