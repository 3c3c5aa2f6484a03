"""Requests to a running vLLM OpenAI server with the `openai` client, one at a time or all at once, and what the
server's /metrics say about how it batched them. test_server.py checks the answers; run as a script it measures
throughput (docs/vllm.md):

    python tests/vllm_plugin/serve_load.py MODEL_DIR [--runs 3]     # starts the server, CPU numbers

Every request is greedy with MAX_TOKENS tokens, and asks for its prompt's and answer's token ids
(`return_token_ids`, a vLLM extension) and the top-TOP (20, vLLM's most) logprobs keyed by token id (`return_tokens_as_token_ids`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("chat", "chat-stream", "completion", "completion-stream")
MAX_TOKENS = 16
TOP = 20  # vLLM's default max_logprobs: a flat tiny-model distribution puts near ties beyond the top 5
REQUEST_S = 120  # one request on the tiny models takes < 5 s, 32 at once < 2 s
LOAD_S = 300
CONCURRENT = 32
# A chat template for the example tokenizer, which has none (a real model brings its own).
CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"
TEXT = (
    "the keeper of the lighthouse climbed the narrow stairs every evening to light the great lamp and watch the "
    "ships pass the rocks while the storm rolled in from the sea and the gulls went quiet on the cliffs below"
).split()


def prompt(i: int) -> str:
    """Request i's prompt: 1 to 25 words of TEXT (mixed lengths: prefills of different sizes share steps)."""
    words = 1 + (i * 7) % 25
    start = (i * 5) % (len(TEXT) - words)
    return " ".join(TEXT[start : start + words])


# (kind, prompt): every kind, mixed lengths
LOAD = [(KINDS[i % len(KINDS)], prompt(i)) for i in range(CONCURRENT)]
ALONE = [("chat", prompt(3)), ("chat-stream", prompt(3)), ("completion", prompt(8)), ("completion-stream", prompt(8))]


@dataclass
class Answer:
    kind: str
    text_in: str
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[dict[int, float]] = field(default_factory=list)  # per step: token id -> logprob (top-TOP + chosen)
    finish_reason: str | None = None


def token_id(name: str) -> int:
    return int(name.removeprefix("token_id:"))  # return_tokens_as_token_ids renders tokens as "token_id:N"


def ask(client, model: str, kind: str, text: str) -> Answer:
    """One request of `kind` through the openai client; streamed answers are reassembled from their chunks."""
    extra = {"return_token_ids": True, "return_tokens_as_token_ids": True}
    common = {"model": model, "max_tokens": MAX_TOKENS, "temperature": 0, "extra_body": extra, "timeout": REQUEST_S}
    stream = kind.endswith("-stream")
    answer = Answer(kind, text)
    if kind.startswith("chat"):
        messages = [{"role": "user", "content": text}]
        reply = client.chat.completions.create(
            messages=messages, logprobs=True, top_logprobs=TOP, stream=stream, **common
        )
        for chunk in reply if stream else [reply]:
            answer.prompt_ids += getattr(chunk, "prompt_token_ids", None) or []
            for choice in chunk.choices:
                answer.text += (choice.delta.content if stream else choice.message.content) or ""
                answer.token_ids += getattr(choice, "token_ids", None) or []
                for step in (choice.logprobs.content or []) if choice.logprobs else []:
                    top = {token_id(t.token): t.logprob for t in step.top_logprobs}
                    answer.logprobs.append(top | {token_id(step.token): step.logprob})
                answer.finish_reason = choice.finish_reason or answer.finish_reason
    else:
        reply = client.completions.create(prompt=text, logprobs=TOP, stream=stream, **common)
        for chunk in reply if stream else [reply]:
            for choice in chunk.choices:
                answer.prompt_ids += getattr(choice, "prompt_token_ids", None) or []
                answer.text += choice.text or ""
                answer.token_ids += getattr(choice, "token_ids", None) or []
                if choice.logprobs:
                    for name, lp, top in zip(choice.logprobs.tokens, choice.logprobs.token_logprobs,
                                             choice.logprobs.top_logprobs, strict=True):  # fmt: skip
                        answer.logprobs.append({token_id(t): v for t, v in top.items()} | {token_id(name): lp})
                answer.finish_reason = choice.finish_reason or answer.finish_reason
    return answer


def metric(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples (over its label sets) in a /metrics page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class Load:
    answers: list[Answer]
    seconds: float  # from the first request sent to the last answer received
    steps: float  # engine steps the server ran meanwhile (vllm:iteration_tokens_total_count)

    @property
    def generated(self) -> int:
        return sum(len(a.token_ids) for a in self.answers)


def concurrent_load(server, client, model: str, requests=LOAD) -> Load:
    """All `requests` at once (a barrier releases them together), answered within LOAD_S."""
    barrier = threading.Barrier(len(requests))

    def one(kind: str, text: str) -> Answer:
        barrier.wait(timeout=60)
        return ask(client, model, kind, text)

    before = metric(server.metrics(), "vllm:iteration_tokens_total_count")
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        start = time.perf_counter()
        futures = [pool.submit(one, kind, text) for kind, text in requests]
        done, late = concurrent.futures.wait(futures, timeout=LOAD_S)
        seconds = time.perf_counter() - start
        if late:
            raise TimeoutError(f"{len(late)} of {len(requests)} requests unanswered after {LOAD_S} s")
        answers = [f.result() for f in futures]
    steps = metric(server.metrics(), "vllm:iteration_tokens_total_count") - before
    return Load(answers, seconds, steps)


def server_flags(template: Path) -> list[str]:
    """The server's settings: eager (CPU), a context the prompts fit, 32 sequences per step at most."""
    return ["--enforce-eager", "--max-model-len", "256", "--max-num-seqs", str(CONCURRENT), "--dtype", "bfloat16",
            "--seed", "0", "--chat-template", str(template)]  # fmt: skip


def main() -> None:
    import openai
    from vllm_server import Server

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plain", action="store_true", help="without the b12x backend flags (a bf16 twin)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "chat_template.jinja"
        template.write_text(CHAT_TEMPLATE)
        with Server(args.model, Path(tmp) / "server.log", *server_flags(template), b12x=not args.plain) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
            concurrent_load(server, client, str(args.model))  # warm-up
            loads = [concurrent_load(server, client, str(args.model)) for _ in range(args.runs)]
    rps = [len(x.answers) / x.seconds for x in loads]
    tps = [x.generated / x.seconds for x in loads]
    print(f"{args.model}: {CONCURRENT} concurrent requests × {MAX_TOKENS} tokens, median of {args.runs} warmed runs: "
          f"{statistics.median(rps):.1f} requests/s, {statistics.median(tps):.0f} generated tokens/s "
          f"({statistics.median(x.generated / x.steps for x in loads):.1f} tokens per engine step)")  # fmt: skip


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    main()
