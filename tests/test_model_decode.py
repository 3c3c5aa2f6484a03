"""benchmarks/model_decode.py on the CPU: its tiny models step through the reference path (bf16 and b12x linears,
the MoE both ways) in both kinds of step, a prefill chunk agrees with the decode step that continues it, b12x's model
agrees with the bf16 model given the same weight values, a batched decode step runs each sequence as alone, and a
saved run's rows become its table, its plot and docs/performance.md's tables (a serving table where a run has
prefill chunks)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import b12x_formats as bf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules

import model_decode as md  # noqa: E402

# K of every projection a multiple of 256 (IQ2's group): hidden 256, 4 heads of 64, intermediate 256
TINY = md.Arch("tiny", 256, 2, 4, 2, 64, 256, 512)
TINY_MOE = md.Arch("tiny_moe", 256, 1, 4, 2, 64, 256, 512, experts=8, top_k=2, qk_norm=True)
# two layers: the second layer's keys of earlier tokens depend on the first's causal attention
TINY_MOE2 = replace(TINY_MOE, layers=2)
# every expert routed: a comparison of two models then has no top-k choice that a rounding flips (a near tie of the
# 2nd and 3rd router logits swaps an expert), and the router's weights still weigh each expert's output
TINY_MOE_ALL = replace(TINY_MOE2, top_k=8)


@pytest.mark.parametrize(
    ("arch", "fmt", "activations"),
    [(TINY, "bf16", "bf16"), (TINY, "IQ2_XS", "bf16"), (TINY, "FP8", "fp8_token"), (TINY_MOE, "NVFP4", "bf16 moe bf16"),
     (TINY, "FP8+input_scale", "fp8_static"), (TINY, "NVFP4+input_scale", "nvfp4"), (TINY_MOE, "bf16", "bf16"),
     (replace(TINY, layers=0), "bf16", "bf16")],
)  # fmt: skip
def test_a_tiny_model_steps_on_the_cpu(arch, fmt, activations):
    torch.manual_seed(0)
    model = md.Model(arch, fmt, device="cpu", max_tokens=8, kv_batch=4, prefill_tokens=8)
    with torch.no_grad():
        logits = model(torch.tensor([1, 5, 7]))
        last = model.prefill(torch.tensor([3, 1, 4, 1, 5, 9]))
    assert logits.shape == (3, arch.vocab) and last.shape == (1, arch.vocab)
    assert logits.dtype == last.dtype == torch.bfloat16
    assert torch.isfinite(logits).all() and torch.isfinite(last).all()
    assert model.activations() == activations


@pytest.mark.parametrize(("arch", "fmt"), [(TINY, "bf16"), (TINY, "IQ2_XS"), (TINY_MOE2, "NVFP4")])
def test_a_prefill_chunk_ends_where_the_decode_step_after_it_continues(arch, fmt):
    """Prefill of a chunk of CTX tokens (causal attention over the chunk) gives its last token the logits a decode
    step gives that token at position CTX - 1 over a KV cache holding the chunk's first CTX - 1 keys and values as
    the prefill wrote them: an independent path (attention over cache slots, no mask) through the same weights. And
    a prefix of the chunk prefilled alone leaves the keys the whole chunk left at its positions."""
    ctx = 8
    torch.manual_seed(0)
    model = md.Model(arch, fmt, device="cpu", max_tokens=ctx, kv_batch=2, prefill_tokens=ctx, ctx=ctx)
    ids = torch.randint(arch.vocab, (ctx,))
    with torch.no_grad():
        last = model.prefill(ids)
        for layer in model.layers:
            layer.k_cache[1, :, : ctx - 1] = layer.k_chunk[0, :, : ctx - 1]
            layer.v_cache[1, :, : ctx - 1] = layer.v_chunk[0, :, : ctx - 1]
        decoded = model(torch.stack([ids[0], ids[-1]]))[1:]  # sequence 1 holds the chunk; sequence 0 is another
        whole = [layer.k_chunk[0, :, :5].clone() for layer in model.layers]
        model.prefill(ids[:5])
    torch.testing.assert_close(decoded.float(), last.float(), atol=0.02 * last.abs().max().item(), rtol=0)
    # causal: the chunk's first 5 tokens leave the keys they leave alone (the 2nd layer's hold the 1st's attention)
    for layer, keys in zip(model.layers, whole, strict=True):
        torch.testing.assert_close(layer.k_chunk[0, :, :5], keys, atol=0.02 * keys.abs().max().item(), rtol=0)


def dequantized(weights) -> torch.Tensor:
    """The bf16 values of checkpoint shards stacked along N (a fused layer's rows)."""
    return torch.from_numpy(np.concatenate([bf.dequantize(w) for w in weights], axis=-2)).to(torch.bfloat16)


def load_b12x_values(ref: md.Model, b12x: md.Model) -> None:
    """Gives the bf16 model the b12x model's linear and expert weights (their exact values, rounded to bf16) and the
    b12x model the bf16 model's embedding, LM head, routers and KV caches: the two then compute the same function."""
    b12x.embed.weight.copy_(ref.embed.weight)
    b12x.lm_head.weight.copy_(ref.lm_head.weight)
    for r, q in zip(ref.layers, b12x.layers, strict=True):
        for name in ("qkv", "o", "gate_up", "down"):
            if hasattr(q, name):
                getattr(r, name).weight.copy_(dequantized(getattr(q, name).shards))
        if hasattr(q, "mlp"):
            q.mlp.router.weight.copy_(r.mlp.router.weight)
            r.mlp.w13, r.mlp.w2 = (dequantized([w]) for w in q.mlp.checkpoints)
        q.k_cache.copy_(r.k_cache)
        q.v_cache.copy_(r.v_cache)


def quantized_checkpoint(fmt: str, role: str, n: int, k: int, lead: tuple[int, ...] = ()) -> bf.QuantizedWeight:
    """Stands in for md.checkpoint: real weights of nn.Linear's scale, quantized (md's random checkpoint bytes give
    activations of 1e5 whose attention and routing flip on a rounding; timing does not care, a comparison does)."""
    rng = np.random.default_rng(abs(hash((role, n, k))) % 2**32)
    return bf.quantize(rng.uniform(-1, 1, (*lead, n, k)) / k**0.5, fmt)


@pytest.mark.parametrize(("arch", "fmt"), [(TINY, "NVFP4"), (TINY, "IQ2_XS"), (TINY_MOE_ALL, "NVFP4")])
def test_the_b12x_model_computes_the_bf16_models_steps_given_the_same_weight_values(arch, fmt, monkeypatch):
    """With weight-only formats (bf16 activations) and the same values, b12x's model and the bf16 model give the same
    logits for a 64-token prefill chunk and a decode step of 64 sequences, to bf16 rounding; the bf16 model with
    its own random weights does not (the tolerance tells a different model apart)."""
    monkeypatch.setattr(md, "checkpoint", quantized_checkpoint)
    torch.manual_seed(0)
    sizes = dict(device="cpu", max_tokens=64, kv_batch=64, prefill_tokens=64, ctx=8)
    ref, b12x, other = md.Model(arch, "bf16", **sizes), md.Model(arch, fmt, **sizes), md.Model(arch, "bf16", **sizes)
    ids = torch.randint(arch.vocab, (64,))
    shared = ("embed.", "lm_head.", ".router.")  # other: ref's embedding, LM head, routers and caches, its own linears
    other.load_state_dict({k: v for k, v in ref.state_dict().items() if any(s in k for s in shared)}, strict=False)
    with torch.no_grad():
        load_b12x_values(ref, b12x)
        for r, o in zip(ref.layers, other.layers, strict=True):
            o.k_cache.copy_(r.k_cache)
            o.v_cache.copy_(r.v_cache)
        for step in (md.Model.prefill, md.Model.forward):
            want, got, apart = step(ref, ids).float(), step(b12x, ids).float(), step(other, ids).float()
            tolerance = 0.02 * want.abs().max().item()
            torch.testing.assert_close(got, want, atol=tolerance, rtol=0)
            assert torch.nn.functional.cosine_similarity(got, want).min() > 0.9995
            assert (apart - want).abs().max() > 5 * tolerance
    assert b12x.activations() in ("bf16", "bf16 moe bf16")


def test_a_decode_step_of_64_sequences_runs_each_as_alone():
    """Batch 64 with tiny dims: each sequence's logits are those of a decode step of that sequence alone (its KV
    cache moved into slot 0), so the batched step reads each sequence's own cache and mixes no rows."""
    torch.manual_seed(0)
    model = md.Model(TINY, "IQ2_XS", device="cpu", max_tokens=64, kv_batch=64, ctx=8)
    ids = torch.randint(TINY.vocab, (64,))
    with torch.no_grad():
        batched = model(ids)
        caches = [(layer.k_cache.clone(), layer.v_cache.clone()) for layer in model.layers]
        for i in (0, 37, 63):
            for layer, (k, v) in zip(model.layers, caches, strict=True):
                layer.k_cache[0], layer.v_cache[0] = k[i], v[i]
            alone = model(ids[i : i + 1])
            torch.testing.assert_close(alone[0].float(), batched[i].float(), atol=0.02, rtol=0.02)
    assert batched.shape == (64, TINY.vocab) and torch.isfinite(batched).all()
    assert not torch.allclose(batched[0].float(), batched[37].float(), atol=0.1)  # the rows are not one row


def old_run() -> dict:
    """A run saved before prefill chunks existed: decode rows that name no step, tokens or context."""
    rows = [dict(model=m, layers=2, format=f, activation="bf16", batch=b, step_us=100.0 * b, tokens_per_s=1e4,
                 bf16_step_us=200.0 * b, bf16_tokens_per_s=5e3, speedup=2.0, head_us=20.0, layer_us=40.0 * b,
                 bf16_layer_us=90.0 * b, build_s=1.0)
            for m, f in (("llama8b", "NVFP4"), ("llama8b", "FP8"), ("qwen3moe", "IQ2_XS")) for b in (1, 4, 16)]  # fmt: skip
    return {"device": "NVIDIA H200", "capability": [9, 0], "date": "2026-01-01", "ctx": 512, "rows": rows}


LLAMA, QWEN = md.ARCHS["llama8b"], md.ARCHS["qwen3moe"]
SERVING_STEPS = [("decode", 1), ("decode", 64), ("decode", 256), ("prefill", 2048)]


def serving_run(with_prefill: bool = True) -> dict:
    """A --serving run's rows as model_decode.row writes them (made-up times): each model × format at decode 1, 64,
    256 and a 2,048-token prefill; FP8 has no decode 256 (as a step b12x refused would leave)."""
    rows = []
    for arch, formats in ((LLAMA, ("NVFP4", "FP8")), (QWEN, ("NVFP4",))):
        for i, fmt in enumerate(formats):
            acts = "bf16 moe bf16" if arch.experts else ("fp8_token" if fmt == "FP8" else "bf16")
            for j, (step, n) in enumerate(SERVING_STEPS):
                if (fmt, step, n) == ("FP8", "decode", 256) or (step == "prefill" and not with_prefill):
                    continue
                us = 3000.0 + 20.0 * n + 700.0 * i
                rows.append(md.row(arch, fmt, acts, step, n, us, us * (1.1 + 0.2 * j + 0.05 * i), 300.0, 2.0))
    return {"device": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "date": "2026-01-02", "ctx": md.CTX, "rows": rows}


def test_a_row_says_which_step_it_timed_and_its_tokens_per_second():
    decode = md.row(LLAMA, "NVFP4", "bf16", "decode", 64, 8000.0, 12000.0, 400.0, 2.5)
    prefill = md.row(LLAMA, "NVFP4", "bf16", "prefill", 2048, 100000.0, 150000.0, 2000.0, 2.5)
    assert (decode["step"], decode["batch"], decode["tokens"], decode["context"]) == ("decode", 64, 64, md.CTX - 1)
    assert (prefill["step"], prefill["batch"], prefill["tokens"], prefill["context"]) == ("prefill", 1, 2048, 0)
    assert decode["tokens_per_s"] == pytest.approx(8000.0) and decode["bf16_tokens_per_s"] == pytest.approx(64 / 0.012)
    assert prefill["tokens_per_s"] == pytest.approx(20480.0) and prefill["speedup"] == pytest.approx(1.5)
    assert prefill["layer_us"] == pytest.approx(98000.0 / 32) and prefill["bf16_layer_us"] == pytest.approx(148000 / 32)
    assert {"model", "layers", "format", "activation", "step_us", "bf16_step_us", "head_us", "build_s"} <= set(decode)


def test_the_serving_preset_asks_for_both_models_prefill_2048_and_decode_64_and_256():
    args = md.parse(["--serving"])
    assert (args.models, args.prefill, args.batches) == ("llama8b,qwen3moe", "2048", "64,256")
    assert (args.formats, args.moe_formats) == (md.parse([]).formats, md.parse([]).moe_formats)  # the defaults
    assert args.budget_s > md.parse([]).budget_s
    assert md.points(md.counts(args.batches), md.counts(args.prefill)) == [("decode", 64), ("decode", 256),
                                                                           ("prefill", 2048)]  # fmt: skip
    assert md.parse(["--serving", "--batches", "128", "--models", "llama8b"]).batches == "128"  # a flag still wins
    assert md.counts(md.parse([]).prefill) == []  # without it: decode steps only, as before


def test_from_json_prints_the_table(tmp_path, capsys):
    (tmp_path / "run.json").write_text(json.dumps(old_run()))
    md.main(["--from-json", str(tmp_path / "run.json"), "--png", ""])
    table = capsys.readouterr().out
    assert (
        table.count("\n| llama8b | 2 | NVFP4 | bf16 |") == 3
        and "| decode B=16 | 1600 | 10000 | 3200 | 5000 | 2.00× | 640.0 | 1440.0 |" in table
    )
    (tmp_path / "serving.json").write_text(json.dumps(serving_run()))
    md.main(["--from-json", str(tmp_path / "serving.json"), "--png", ""])
    table = capsys.readouterr().out
    assert (
        "| llama8b | 32 | NVFP4 | bf16 | prefill T=2048 | 43960 | 46588 | 74732 | 27405 | 1.70× | 1364.4 | 2326.0 |"
        in table
    )


@pytest.mark.parametrize("run", [old_run, serving_run])
def test_from_json_draws_the_plot(tmp_path, run):
    pytest.importorskip("matplotlib")
    (tmp_path / "run.json").write_text(json.dumps(run()))
    md.main(["--from-json", str(tmp_path / "run.json"), "--png", str(tmp_path / "run.png")])
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def page_of(tmp_path, capsys, *runs: dict, plots: bool = False) -> str:
    import performance_page

    names = []
    for i, run in enumerate(runs):
        names.append(str(tmp_path / f"run{i}.json"))
        Path(names[-1]).write_text(json.dumps(run))
    assert performance_page.main([*names, *(["--plots", str(tmp_path)] if plots else [])]) == 0
    return capsys.readouterr().out


def test_the_performance_page_gives_a_model_with_prefill_chunks_a_serving_table(tmp_path, capsys):
    """docs/performance.md from a run with prefill rows: after each model's decode-step table, a table of format ×
    {prefill T=2048, decode B=64, decode B=256} with b12x's tokens/s, the bf16 model's and their ratio, read from the
    rows' own fields; decode B=1 stays in the decode-step table only; a cell not measured is a dash."""
    run = serving_run()
    text = page_of(tmp_path, capsys, run)
    title = "### Llama-3.1-8B-shaped model: a prefill chunk and batched decode, tokens/s"
    steps_at, serving_at = text.index("### Llama-3.1-8B-shaped model, one decode step"), text.index(title)
    assert steps_at < serving_at < text.index("### Qwen3-30B-A3B-shaped model, one decode step")
    assert "### Qwen3-30B-A3B-shaped model: a prefill chunk and batched decode, tokens/s" in text
    serving = text[serving_at:].split("\n### ")[0]
    assert ("| format × activations | prefill T=2048: b12x tok/s | bf16 tok/s | × bf16 | decode B=64: b12x tok/s | "
            "bf16 tok/s | × bf16 | decode B=256: b12x tok/s | bf16 tok/s | × bf16 |") in serving  # fmt: skip
    cells = {(r["format"], r["step"], r["tokens"]): r for r in run["rows"] if r["model"] == "llama8b"}
    nvfp4 = next(line for line in serving.splitlines() if line.startswith("| NVFP4 × bf16 |")).split(" | ")[1:]
    want = []
    for key in (("NVFP4", "prefill", 2048), ("NVFP4", "decode", 64), ("NVFP4", "decode", 256)):
        r = cells[key]
        want += [f"{r['tokens_per_s']:,.0f}", f"{r['bf16_tokens_per_s']:,.0f}", f"{r['speedup']:.2f}<sup>a</sup>"]
    assert [c.rstrip(" |") for c in nvfp4] == want
    fp8 = next(line for line in serving.splitlines() if line.startswith("| FP8 × fp8_token |")).split(" | ")[1:]
    assert [c.rstrip(" |") for c in fp8[-3:]] == ["—"] * 3
    assert "B=1" not in serving and "| B=1 | B=64 | B=256 |" in text  # decode B=1: the decode-step table only
    assert "](results/performance_h100_80gb_hbm3_serving_llama8b.png)" in serving
    prefill = [r["speedup"] for r in run["rows"] if r["step"] == "prefill"]
    assert (
        f"whole-model prefill chunks (× the bf16 model's step): {min(prefill):.2f}-{max(prefill):.2f}× at T 2048"
        in text
    )


def test_the_performance_page_has_no_serving_table_without_prefill_chunks(tmp_path, capsys):
    run = serving_run(with_prefill=False)
    text = page_of(tmp_path, capsys, run, old_run())
    assert "prefill" not in text and "tok/s" not in text and "_serving_" not in text
    assert "| B=1 | B=64 | B=256 |" in text  # the batched decode steps are in the decode-step tables
    small = [r["speedup"] for r in run["rows"] if r["batch"] == 1]
    large = [r["speedup"] for r in run["rows"] if r["batch"] >= 64]
    assert (f"- NVIDIA H100 80GB HBM3, whole-model decode steps (× the bf16 model's step): {min(small):.2f}-"
            f"{max(small):.2f}× at B 1-16; {min(large):.2f}-{max(large):.2f}× at B ≥ 64") in text  # fmt: skip


def test_the_performance_page_draws_the_serving_table(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    page_of(tmp_path, capsys, serving_run(), plots=True)
    for model in ("llama8b", "qwen3moe"):
        png = tmp_path / f"performance_h100_80gb_hbm3_serving_{model}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
