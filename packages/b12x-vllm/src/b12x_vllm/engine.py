"""One model in vLLM with the b12x backends, in a process of its own: perplexity, a chat answer, tokens/s.

    python -m b12x_vllm.engine MODEL_DIR OUT.json [--text FILE] [--chat QUESTION] [--speed-runs N]

`eval.py` and `demo.py` start this as a subprocess whose output goes to a log file: vLLM owns its process
(engine state, logging, OpenMP threads), so a second checkpoint gets a fresh process, and the user's terminal
shows only results. The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so report.py sees
every prepared b12x layer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

SPEED_PROMPT = "The history of the lighthouse"
SPEED_TOKENS = 32


def load(model: str, max_model_len: int):
    from vllm import LLM

    return LLM(
        model=model, linear_backend="b12x", moe_backend="b12x", enforce_eager=True, max_model_len=max_model_len,
        max_num_seqs=4, dtype="bfloat16", seed=0,
    )  # fmt: skip


def default_context(model: Path) -> int:
    """1024 tokens, or fewer where the model's config says so: enough for the paragraph, the chat and the timing
    runs, and a KV cache that fits VLLM_CPU_KVCACHE_SPACE=1 (GiB) for any model."""
    config = json.loads((model / "config.json").read_text()) if (model / "config.json").exists() else {}
    return min(1024, int(config.get("max_position_embeddings") or 1024))


def token_ids(llm, text: str) -> list[int]:
    """The text as the model reads it: the tokenizer's own special tokens (a BOS where the model uses one)."""
    return list(llm.get_tokenizer()(text).input_ids)


def token_logprobs(llm, ids: list[int], window: int) -> list[float]:
    """log p(token | the tokens before it) for every token after the first of each window of `window` tokens
    (texts longer than the context are scored in consecutive, non-overlapping windows)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    chunks = [ids[i : i + window] for i in range(0, len(ids), window)]
    chunks = [c for c in chunks if len(c) > 1]
    scores = []
    for out in llm.generate([{"prompt_token_ids": c} for c in chunks], params, use_tqdm=False):
        scores += [step[token].logprob for token, step in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:],
                                                                strict=True)]  # fmt: skip
    return scores


def perplexity(logprobs: list[float]) -> float:
    """exp(mean negative log-likelihood)."""
    return math.exp(-sum(logprobs) / len(logprobs))


def chat(llm, question: str, max_tokens: int = 64) -> str:
    """The model's greedy answer through its chat template; a model whose tokenizer has none (a base model, the
    example checkpoint) continues the question as plain text instead."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    if getattr(llm.get_tokenizer(), "chat_template", None):
        out = llm.chat([{"role": "user", "content": question}], params, use_tqdm=False)
    else:
        out = llm.generate([question], params, use_tqdm=False)
    return out[0].outputs[0].text.strip()


def tokens_per_second(llm, runs: int) -> dict:
    """Greedy generation of SPEED_TOKENS tokens after one warm-up run; the median and every run's rate."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=SPEED_TOKENS, temperature=0.0, ignore_eos=True)
    llm.generate([SPEED_PROMPT], params, use_tqdm=False)  # warm-up: first-call allocations, caches
    rates = []
    for _ in range(runs):
        start = time.perf_counter()
        out = llm.generate([SPEED_PROMPT], params, use_tqdm=False)[0].outputs[0]
        rates.append(len(out.token_ids) / (time.perf_counter() - start))
    return {"median": statistics.median(rates), "runs": rates, "tokens": SPEED_TOKENS}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--text", type=Path, help="score this text's perplexity")
    parser.add_argument("--chat", help="answer this question with the model's chat template (greedy)")
    parser.add_argument("--speed-runs", type=int, default=0, help="warmed tokens/s runs (0: none)")
    parser.add_argument("--max-model-len", type=int, help="context per request (default: 1024 or the model's)")
    args = parser.parse_args(argv)

    for key, value in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
                       "HF_HUB_OFFLINE": "1"}.items():  # fmt: skip
        os.environ.setdefault(key, value)
    from . import report

    max_model_len = args.max_model_len or default_context(Path(args.model))
    start = time.perf_counter()
    llm = load(args.model, max_model_len)
    result: dict = {"model": args.model, "load_s": time.perf_counter() - start}
    result["quantization"] = llm.llm_engine.vllm_config.model_config.quantization
    if args.text:
        ids = token_ids(llm, args.text.read_text())
        scores = token_logprobs(llm, ids, max_model_len - 1)  # each window plus the one token generated fits
        result |= {"perplexity": perplexity(scores), "tokens": len(scores), "token_ids": ids, "logprobs": scores}
    if args.chat:
        result["chat"] = {"question": args.chat, "answer": chat(llm, args.chat)}
    if args.speed_runs:
        result["tokens_per_s"] = tokens_per_second(llm, args.speed_runs)
    result["b12x"] = report.layer_types()
    result["b12x_why"] = report.reason_line()
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, args.out)  # the caller never reads a half-written result


if __name__ == "__main__":
    main()
