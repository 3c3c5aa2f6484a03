"""vLLM's OpenAI server with `--linear-backend b12x --moe-backend b12x`, as users run it: the tiny mixed-precision
Llama and Qwen3-MoE (tiny_models.py, shared with test_e2e_cpu.py) served on loopback, talked to with the `openai`
client (serve_load.py): chat and completions, streamed and not, one at a time and 32 at once.

Every answer is held to the same checkpoint's offline greedy run with each request alone (run_vllm.py,
max_num_seqs=1): token ids agree until the first step where they differ, and there the server's token must be a
near tie (contexts differ from there on): in the offline run or in the server's, the other run's token is among the
top TOP = 20 and within NEAR_TIE nats of that run's own choice;
the logprobs of agreeing tokens agree within LOGPROB_TOL, and wholly agreeing answers have the same text.
Both are the same weights run by the same b12x reference; what differs is how many tokens share a forward pass
(the alone runs decode one token per step, the concurrent ones up to 32), hence float32 summation order and the
bf16 roundings after it. Measured on CPU: |Δ logprob| of agreeing tokens 0 for requests alone, at most 0.017
(Llama) and 0.061 (MoE: MXFP8 activations, routing) in the concurrent runs, where 1 and 5 of the 32 answers took the
other branch of a near tie. LOGPROB_TOL = 0.25 (test_e2e_cpu's bound) leaves room for other CPUs' summation orders
and still catches a broken layer or a mixed-up request (nats). A random tiny model's next-token distribution is
flat (top logprobs ≈ -4, exact ties seen), so near ties are common. NEAR_TIE = 2 · LOGPROB_TOL bounds how far from
the offline choice a batched answer may branch: the largest gap that a drift within LOGPROB_TOL of each of the two
tokens closes. (It was LOGPROB_TOL alone until a concurrent MoE answer branched at an offline gap of 0.375 nats:
-3.773 for the offline choice, -4.148 for the server's, the 4th of the top 5; a router near tie flips an expert
in one run and not in the other, which moves a step's logprobs by more than the agreeing tokens' 0.061.)
Near ties are judged from both runs' top 20, not the offline top 5: CI once saw a concurrent MoE answer branch to a
token outside the offline top 5, whose five logprobs spanned 0.11 nats (-4.06 to -4.17): in a distribution that
flat the other branch's token may rank anywhere among the next dozen, and a top 5 cannot tell a near tie from a
mixed-up request.
A router near tie can also flip an expert without changing the greedy token: CI once saw a concurrent MoE answer's
first token agree with the offline run's, its logprob 0.40 nats from the offline one. So in the MoE model an agreeing
token further than LOGPROB_TOL off is where the runs part too (no later step is compared), when the two runs' top
TOP still name the same request: at least SAME_REQUEST of their tokens in common, where two different prompts' flat
top 20 of the 512-token vocabulary share about one (20 · 20 / 512), and at least 5 by chance once in ~1700.
The Llama model has no router, so there every agreeing token stays within LOGPROB_TOL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")

import serve_load  # noqa: E402
from serve_load import ALONE, CHAT_TEMPLATE, CONCURRENT, MAX_TOKENS, TOP, Answer, Load  # noqa: E402
from vllm_server import Server  # noqa: E402

LOGPROB_TOL = 0.25
NEAR_TIE = 2 * LOGPROB_TOL
SAME_REQUEST = TOP // 4  # tokens two runs' top TOP share when they answer the same request (module docstring)
RUNNER = Path(__file__).with_name("run_vllm.py")
OFFLINE_S = 600


@dataclass
class Served:
    alone: list[Answer]  # ALONE, one request at a time
    load: Load  # serve_load.LOAD, all at once
    ref_alone: list[dict]  # the offline run of each request's prompt ids, each alone
    ref_load: list[dict]
    log: str  # the server's output
    routed: bool  # the model has a router (MoE), whose near ties may flip an expert between runs


def offline(model: Path, work: Path, prompts: list[list[int]]) -> list[dict]:
    """Greedy answers to `prompts` (token ids) from vLLM's offline LLM, one request at a time."""
    (work / "prompts.json").write_text(json.dumps(prompts))
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_B12X_MOE_FP4_FORCE_A16="0")  # fmt: skip
    cmd = [sys.executable, str(RUNNER), str(model), str(work / "offline.json"), "--prompts", str(work / "prompts.json"),
           "--max-num-seqs", "1", "--max-model-len", "256", "--max-tokens", str(MAX_TOKENS), "--logprobs", str(TOP),
           "--detokenize",
           "--linear-backend", "b12x", "--moe-backend", "b12x"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=OFFLINE_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((work / "offline.json").read_text())["requests"]


@pytest.fixture(scope="module", params=["llama", "qwen3_moe"])
def served(request, tiny_models, tmp_path_factory) -> Served:
    """One server per model: the requests alone, then all at once; the server stopped; then the offline run."""
    model = tiny_models[request.param].quantized
    work = tmp_path_factory.mktemp(f"served_{request.param}")
    (work / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    with Server(model, work / "server.log", *serve_load.server_flags(work / "chat_template.jinja")) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
        alone = [serve_load.ask(client, str(model), kind, text) for kind, text in ALONE]
        load = serve_load.concurrent_load(server, client, str(model))
        # the log of serving, before the stop: at SIGTERM vLLM's front end may log its engine's exit as a traceback
        log = (work / "server.log").read_text()
    print(f"{request.param}: {CONCURRENT} concurrent requests in {load.seconds:.2f} s: "
          f"{CONCURRENT / load.seconds:.1f} requests/s, {load.generated / load.seconds:.0f} tokens/s, "
          f"{load.generated / load.steps:.1f} tokens per engine step")  # fmt: skip
    ref = offline(model, work, [a.prompt_ids for a in alone + load.answers])
    return Served(alone, load, ref[: len(alone)], ref[len(alone) :], log, request.param == "qwen3_moe")


def near_tie(step: dict[int, float], chosen: int, other: int) -> bool:
    """Whether one run's step (its top-TOP logprobs) ranks `other` within NEAR_TIE nats of its own `chosen` token."""
    return other in step and step[chosen] - step[other] <= NEAR_TIE


def same_request(ours: dict[int, float], ref: dict[int, float]) -> bool:
    """Whether two runs' top-TOP logprobs at a step share the tokens of one request's answer (module docstring)."""
    return len(set(ours) & set(ref)) >= SAME_REQUEST


def check_against_alone(ours: Answer, ref: dict, routed: bool = False) -> list[float]:
    """Greedy tokens equal until a near tie, or in a `routed` (MoE) model until an expert flip (module docstring);
    returns |Δ logprob| of the agreeing tokens."""
    assert ours.prompt_ids and len(ours.token_ids) == len(ours.logprobs) >= 1, ours
    deltas = []
    for step, (t_ours, t_ref) in enumerate(zip(ours.token_ids, ref["tokens"], strict=False)):  # lengths: below
        ref_step = {int(t): lp for t, lp in ref["logprobs"][step].items()}
        where = (ours.kind, ours.text_in, step, t_ours, t_ref, ref_step)
        if t_ours != t_ref:
            assert near_tie(ref_step, t_ref, t_ours) or near_tie(ours.logprobs[step], t_ours, t_ref), (
                *where, ours.logprobs[step])  # fmt: skip
            return deltas
        delta = abs(ours.logprobs[step][t_ours] - ref_step[t_ref])
        if routed and delta > LOGPROB_TOL and same_request(ours.logprobs[step], ref_step):
            return deltas  # a router near tie flipped an expert in one run: the runs part here
        deltas.append(delta)
        assert delta <= LOGPROB_TOL, (*where, ours.logprobs[step])
    assert ours.token_ids == ref["tokens"] and ours.text == ref["text"], (ours, ref["tokens"], ref["text"])
    return deltas


def test_the_server_runs_the_checkpoint_with_b12x(served):
    assert "quantization=b12x" in served.log, served.log[-3000:]  # the backend flags reached vLLM's config
    assert "Traceback" not in served.log


def test_chat_and_completions_match_the_offline_run(served):
    kinds = [a.kind for a in served.alone]
    assert kinds == ["chat", "chat-stream", "completion", "completion-stream"]
    for ours, ref in zip(served.alone, served.ref_alone, strict=True):
        assert ours.finish_reason in ("length", "stop") and len(ours.token_ids) <= MAX_TOKENS
        deltas = check_against_alone(ours, ref)
        print(f"{ours.kind}: {len(deltas)} tokens agree, max |Δ logprob| {max(deltas, default=0):.4f}")


def test_streamed_answers_equal_the_whole_ones(served):
    """The same request streamed and not: the same prompt ids, token ids, text and logprobs (it ran alone both
    times, so the same computation)."""
    for whole, streamed in (served.alone[0:2], served.alone[2:4]):
        assert (streamed.prompt_ids, streamed.token_ids, streamed.text) == (whole.prompt_ids, whole.token_ids,
                                                                            whole.text)  # fmt: skip
        assert streamed.logprobs == whole.logprobs


def test_completion_prompt_is_the_tokenizers_reading(served, tiny_models):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_models["llama"].quantized / "tokenizer.json"))
    completion = served.alone[2]
    assert completion.prompt_ids == tokenizer.encode(completion.text_in).ids


def test_32_concurrent_requests_match_each_alone(served):
    answers = served.load.answers
    assert len(answers) == CONCURRENT and all(a.finish_reason in ("length", "stop") for a in answers)
    deltas, diverged = [], 0
    for ours, ref in zip(answers, served.ref_load, strict=True):
        agreed = check_against_alone(ours, ref, served.routed)
        deltas += agreed
        diverged += len(agreed) < len(ours.token_ids)
    print(f"{CONCURRENT} concurrent answers: {diverged} parted at a near tie or an expert flip; "
          f"max |Δ logprob| {max(deltas, default=0):.4f} over {len(deltas)} agreeing tokens")  # fmt: skip


def test_the_server_batched_the_concurrent_requests(served):
    """Answered one at a time, a request decodes one token per engine step (its prefill step yields the first), so
    the steps would be at least the tokens generated; with several requests per step, b12x's plans ran at M > 1.
    How many share a step depends on how fast the front end hands requests to the engine: on a loaded machine (the
    suite runs on two xdist workers) about two a step were seen, alone far more; 1.5 still rules out one at a time."""
    load = served.load
    assert load.steps >= 1
    assert load.generated >= 1.5 * load.steps, (load.generated, load.steps)
