"""End to end on CPU: tiny random models quantized with b12x-formats, served by vLLM through the plugin,
against vLLM running the same weights dequantized to bf16.

Checks: greedy tokens agree until the first step where they differ, and there the step must be a near tie: in
one of the two runs the other's token is among its top 20 and within LOGPROB_TOL of its own choice (a top 5 of
a random model's flat distribution can span 0.1 nats, too few tokens to tell); prompt and generated-token logprobs
agree within LOGPROB_TOL.
LOGPROB_TOL = 0.25 nats: measured differences are ≈0.03–0.06, from activation quantization (FP8 per token)
and bf16 vs float32 rounding of the dequantized weights. MoE runs use bf16 activations here; the MXFP8 default
of MXFP4 experts is checked on teacher-forced logprobs only, within MXFP8_LOGPROB_TOL.

A mixture of experts is discontinuous where a router's k-th and (k+1)-th experts tie: there the same rounding
differences pick other experts, and everything downstream of that token legitimately differs (seen: 0.19 vs
0.185 router probability moving a logprob by 0.5 nats; on some seeds by more than 1 nat, or a greedy token out
of the float model's top 5). Such near ties come with any random model. So MoE runs record every router's
logits (run_vllm.py --record-routing) and the comparison is exact about routing:
- wherever the inputs of a router can only differ by rounding (no different routing upstream), its logits agree
  within ROUTER_TOL: the router is a linear map of the normalized hidden state like the head, ROUTER_SCALE×
  larger, so the head's LOGPROB_TOL scaled by ROUTER_SCALE;
- logprobs are held to their tolerance at every output that routed alike in both models; an output downstream
  of a token routed differently (that token's own output; every later one, where the flip is below the last
  layer) is not compared, and greedy comparison stops there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")

from run_vllm import PROMPTS  # noqa: E402
from tiny_models import MOE_LAYERS  # noqa: E402
from tiny_models import build as build_model  # noqa: E402

from b12x_formats.cli import main as formats_cli  # noqa: E402
from b12x_formats.example import ROUTER_SCALE, TINY_QWEN3_MOE  # noqa: E402

LOGPROB_TOL = 0.25
MXFP8_LOGPROB_TOL = 1.0
ROUTER_TOL = ROUTER_SCALE * LOGPROB_TOL
TOP_K = TINY_QWEN3_MOE["num_experts_per_tok"]
RUNNER = Path(__file__).with_name("run_vllm.py")
TOP_LOGPROBS = 20  # each step's top 20 (vLLM's most): a random model's flat distribution packs near ties beyond 5


def run_vllm(model: Path, out: Path, *flags: str, force_a16: bool = False, tp: int = 1) -> dict:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env["VLLM_B12X_MOE_FP4_FORCE_A16"] = "1" if force_a16 else "0"
    if tp > 1:  # workers run in processes of their own, one core each
        env |= {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "|".join(map(str, range(tp)))}
        flags = (*flags, "--tensor-parallel-size", str(tp))
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(model), str(out), "--logprobs", str(TOP_LOGPROBS), *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def build(tmp: Path, arch: str, default: str, layers: list[str], rng: np.random.Generator) -> tuple[Path, Path]:
    return build_model(tmp, arch, default, layers, seed=int(rng.integers(1 << 30)))  # B12X_SEED replays it


def routed(run: dict) -> list[list[list[list[float]]]]:
    """Router logits per request, position and layer, from run_vllm.py's --record-routing: each row of each
    forward belongs to the one request whose next unprocessed position holds that token."""
    seqs = [prompt + req["tokens"] for prompt, req in zip(PROMPTS, run["requests"], strict=True)]
    rows: list[list] = [[] for _ in seqs]
    for record in run["routing"]:
        for i, (pos, tok) in enumerate(zip(record["positions"], record["ids"], strict=True)):
            owner = [r for r, seq in enumerate(seqs) if len(rows[r]) == pos < len(seq) and seq[pos] == tok]
            assert len(owner) == 1, (pos, tok, owner)
            rows[owner[0]].append([layer[i] for layer in record["routers"]])
    assert [len(r) for r in rows] == [len(seq) - 1 for seq in seqs]  # every token but the last generated one
    return rows


def flipped(a: list[float], b: list[float]) -> bool:
    """The two logit rows pick different top-k experts, or either ties at its k-th: vLLM's pick is then arbitrary."""
    ia, ib = np.argsort(-np.asarray(a), kind="stable"), np.argsort(-np.asarray(b), kind="stable")
    tie = a[ia[TOP_K - 1]] == a[ia[TOP_K]] or b[ib[TOP_K - 1]] == b[ib[TOP_K]]
    return tie or set(ia[:TOP_K]) != set(ib[:TOP_K])


def routed_alike(ours: dict, ref: dict) -> list[list[bool]]:
    """Per request and position (while both runs saw the same tokens): does the output there depend only on
    inputs that both models routed alike? Checks ROUTER_TOL on every router whose input is comparable.

    A router of layer l at position p reads the residual after attention l, which mixes positions ≤ p of
    layer l-1's output: a different routing at a layer m < l at a position ≤ p makes its input differ. The head
    at p reads the residual after the last layer at p: the same, with m below the last layer, plus the last
    layer's own routing at p."""
    alike = []
    for r, (rows_ours, rows_ref) in enumerate(zip(routed(ours), routed(ref), strict=True)):
        seq_ours, seq_ref = PROMPTS[r] + ours["requests"][r]["tokens"], PROMPTS[r] + ref["requests"][r]["tokens"]
        layers = len(rows_ref[0])
        first_flip = [len(rows_ref)] * layers  # per layer, the first position routed differently
        alike.append([])
        for p, (row_ours, row_ref) in enumerate(zip(rows_ours, rows_ref, strict=False)):  # EOS may end one first
            if seq_ours[p] != seq_ref[p]:
                break  # contexts differ from here on
            for layer in range(layers):
                if min(first_flip[:layer], default=p + 1) <= p:
                    break  # this router's input, and every later one's here, differs by routing upstream
                a, b = row_ours[layer], row_ref[layer]
                diff = max(abs(x - y) for x, y in zip(a, b, strict=True))
                assert diff <= ROUTER_TOL, (f"request {r} position {p} layer {layer}: router logits", a, b)
                if flipped(a, b):
                    first_flip[layer] = min(first_flip[layer], p)
            alike[r].append(min(first_flip[:-1], default=p + 1) > p and first_flip[-1] != p)
    return alike


def close(ours: float, ref: float, tol: float, where) -> int:
    assert abs(ours - ref) <= tol, (abs(ours - ref), where)
    return 1


def compare_prompt_logprobs(ours: dict, ref: dict, tol: float = LOGPROB_TOL, alike=None) -> int:
    """Teacher-forced logprobs (token j's comes from the output at j-1); with `alike` (routed_alike), only at
    outputs routed alike. Returns how many were compared."""
    compared = 0
    for r, (req_ours, req_ref) in enumerate(zip(ours["requests"], ref["requests"], strict=True)):
        pairs = zip(req_ours["prompt_logprobs"][1:], req_ref["prompt_logprobs"][1:], strict=True)
        for j, (lp_ours, lp_ref) in enumerate(pairs, start=1):
            if alike is None or alike[r][j - 1]:
                for token in set(lp_ours) & set(lp_ref):
                    compared += close(lp_ours[token], lp_ref[token], tol, (r, token, lp_ours, lp_ref))
    return compared


def near_tie(step: dict, chosen: int, other: int) -> bool:
    """Whether one run's step (its top logprobs by token id string) ranks `other` within LOGPROB_TOL of `chosen`."""
    return str(other) in step and step[str(chosen)] - step[str(other)] <= LOGPROB_TOL


def compare(ours: dict, ref: dict, moe: bool = False) -> None:
    """Teacher-forced prompt logprobs, then greedy generation until the first (near-tie) divergence; for a MoE,
    only where both models routed alike (routed_alike), which needs both runs' --record-routing."""
    alike = routed_alike(ours, ref) if moe else None
    compared = compare_prompt_logprobs(ours, ref, LOGPROB_TOL, alike)
    for r, (req_ours, req_ref) in enumerate(zip(ours["requests"], ref["requests"], strict=True)):
        for step, (t_ours, t_ref) in enumerate(zip(req_ours["tokens"], req_ref["tokens"], strict=True)):
            if alike is not None and not alike[r][len(PROMPTS[r]) + step - 1]:
                break  # this token comes from an output routed differently: not comparable, nor anything after
            ref_step = req_ref["logprobs"][step]
            if t_ours != t_ref:  # a near tie: in either model the other's token is a close runner-up
                ours_step = req_ours["logprobs"][step]
                assert near_tie(ref_step, t_ref, t_ours) or near_tie(ours_step, t_ours, t_ref), (
                    step, t_ours, t_ref, ref_step, ours_step)  # fmt: skip
                break  # contexts differ from here on
            compared += close(req_ours["logprobs"][step][str(t_ours)], ref_step[str(t_ref)], LOGPROB_TOL, step)
    assert compared, "no logprob compared"


@pytest.mark.parametrize(
    "arch,expected",
    [
        ("llama", {"linear IQ2_XS × bf16", "linear FP8 × fp8", "linear MXFP4 × bf16", "linear NVFP4 × bf16",
                   "linear IQ2_XXS × bf16", "linear Q8_0 × bf16", "embedding Q8_0"}),
        ("qwen3_moe", {"moe IQ2_XS × bf16", "moe MXFP4 × bf16", "linear NVFP4 × bf16", "linear IQ2_XXS × bf16",
                       "linear Q8_0 × bf16", "embedding Q8_0"}),
    ],
)  # fmt: skip
def test_mixed_precision_model_matches_its_float_twin(tmp_path, tiny_models, arch, expected):
    model = tiny_models[arch]  # tiny_models.MIXES: the Llama's and the MoE's mixes, shared with test_server.py
    # bf16 activations everywhere (VLLM_B12X_MOE_FP4_FORCE_A16=1 for the MXFP4 experts), as in the float twin:
    # a mixture of experts amplifies activation-quantization noise through routing flips
    moe = ("--record-routing",) if arch == "qwen3_moe" else ()
    ours = run_vllm(model.quantized, tmp_path / "ours.json", *moe, force_a16=True)
    ref = run_vllm(model.floating, tmp_path / "ref.json", *moe)
    assert ours["quantization"] == "b12x" and ref["quantization"] is None
    ran = {key.rsplit(" -> ", 1)[0] for key in ours["b12x"]}
    assert expected <= ran, ours["b12x"]
    assert all(key.endswith("-> reference") for key in ours["b12x"])
    compare(ours, ref, moe=arch == "qwen3_moe")


def test_tied_lm_head_runs_over_the_quantized_embedding(tmp_path, rng):
    """tie_word_embeddings with a Q8_0 embedding: the head is a b12x linear over the embedding's bytes (vLLM's float
    head cannot multiply GGML blocks), and the model matches its float twin, whose head vLLM ties as usual."""
    from b12x_formats.checkpoint import save_checkpoint
    from b12x_formats.example import TINY_LLAMA, llama_tensors

    config = dict(TINY_LLAMA, tie_word_embeddings=True)
    tensors = llama_tensors(config, seed=int(rng.integers(1 << 30)))
    del tensors["lm_head.weight"]  # tied checkpoints store the matrix once, as the embedding
    save_checkpoint(tmp_path / "hf", tensors.items(), config)
    layers = ["model.embed_tokens=Q8_0", "*.mlp.down_proj=IQ2_XS"]
    args = ["quantize", str(tmp_path / "hf"), str(tmp_path / "b12x"), "--default", "NVFP4"]
    assert formats_cli(args + [a for rule in layers for a in ("--layer", rule)]) == 0
    assert formats_cli(["dequantize", str(tmp_path / "b12x"), str(tmp_path / "float")]) == 0
    ours = run_vllm(tmp_path / "b12x", tmp_path / "ours.json")
    heads = [(row["layer"], row["count"], row["runs"]) for row in ours["layers"] if row["layer"].startswith("lm_head")]
    assert heads == [("lm_head (tied to model.embed_tokens)", 1, "linear Q8_0 × bf16 -> reference")], ours["layers"]
    compare(ours, run_vllm(tmp_path / "float", tmp_path / "ref.json"))


TP_LAYERS = [  # per-rank K stays a multiple of every group: o_proj (K=256) and down_proj (K=512) split in two
    "model.layers.0.self_attn.[qkv]_proj=MXFP4", "model.layers.1.self_attn.[qkv]_proj=FP8",
    "model.layers.0.self_attn.o_proj=NVFP4", "model.layers.1.self_attn.o_proj=Q8_0",
    "model.layers.1.mlp.down_proj=Q8_0", "model.embed_tokens=Q8_0", "lm_head=Q8_0",
]  # fmt: skip


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="tensor parallelism on CPU needs a core per rank")
def test_tensor_parallel_two_ranks(tmp_path, rng):
    """Column- and row-parallel shards (fused qkv / gate_up, vocab-split embedding and head) on whole blocks."""
    quantized, floating = build(tmp_path, "llama", "IQ2_XS", TP_LAYERS, rng)
    ours = run_vllm(quantized, tmp_path / "ours.json", tp=2)
    assert ours["quantization"] == "b12x"
    compare(ours, run_vllm(floating, tmp_path / "ref.json"))


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="tensor parallelism on CPU needs a core per rank")
def test_tensor_parallel_moe_two_ranks(tmp_path, rng):
    """MXFP4 experts split on the intermediate dim (128 per rank, whole 32-blocks); teacher-forced logprobs."""
    quantized, floating = build(tmp_path, "qwen3_moe", "Q8_0", ["model.layers.*.mlp.experts.*=MXFP4"], rng)
    ours = run_vllm(quantized, tmp_path / "ours.json", "--record-routing", force_a16=True, tp=2)
    assert ours["quantization"] == "b12x"
    ref = run_vllm(floating, tmp_path / "ref.json", "--record-routing")
    assert compare_prompt_logprobs(ours, ref, LOGPROB_TOL, routed_alike(ours, ref))


def test_mxfp4_moe_defaults_to_mxfp8_activations(tmp_path, tiny_models):
    """Without the env var MXFP4 experts quantize their activations to MXFP8; teacher-forced logprobs stay close
    to the float twin where both routed alike (looser: MXFP8 activation noise)."""
    quantized, floating = tiny_models["qwen3_moe"].quantized, tiny_models["qwen3_moe"].floating
    assert "model.layers.1.mlp.experts.*=MXFP4" in MOE_LAYERS
    ours = run_vllm(quantized, tmp_path / "ours.json", "--record-routing")
    assert "moe MXFP4 × mxfp8 -> reference" in ours["b12x"], ours["b12x"]
    ref = run_vllm(floating, tmp_path / "ref.json", "--record-routing")
    assert compare_prompt_logprobs(ours, ref, MXFP8_LOGPROB_TOL, routed_alike(ours, ref))


def test_backend_flags_claim_modelopt_checkpoints(tmp_path, rng):
    """A checkpoint without GGML blocks is b12x's only when asked for (--linear-backend / --moe-backend)."""
    quantized, _ = build(tmp_path, "llama", "NVFP4", [], rng)
    ours = run_vllm(quantized, tmp_path / "ours.json", "--linear-backend", "b12x")
    assert ours["quantization"] == "b12x"
    assert ours["b12x"] == {"linear NVFP4 × bf16 -> reference": 8}  # 2 layers × (qkv, o, gate_up, down)
