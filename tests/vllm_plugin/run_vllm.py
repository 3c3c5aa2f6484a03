"""Run a checkpoint in vLLM (CPU) and print greedy tokens and logprobs as JSON (used by test_e2e_cpu.py).

    python tests/vllm_plugin/run_vllm.py MODEL_DIR OUT.json [--quantization b12x] [--linear-backend b12x] ...

--record-routing adds "routing": every forward's token ids, positions and each MoE router's logits (hooks on the
`*.mlp.gate` modules), so a test can tell where two models routed a token differently.
`--prompts FILE.json` (lists of token ids) replaces the fixed PROMPTS; `--max-num-seqs 1` runs each request alone;
`--detokenize` adds each answer's text (test_server.py compares the server's answers with these).

A separate process per model: vLLM owns its process state, and its engine runs in subprocesses.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPTS = [[5, 17, 42, 99, 7, 250, 3], [300, 11, 64, 128, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--quantization")
    parser.add_argument("--linear-backend")
    parser.add_argument("--moe-backend")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--record-routing", action="store_true")
    parser.add_argument("--prompts", help="a JSON file: a list of prompts, each a list of token ids")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--max-model-len", type=int, default=128)
    parser.add_argument("--logprobs", type=int, default=5, help="how many top logprobs each step records")
    parser.add_argument("--detokenize", action="store_true", help="load the tokenizer and return each answer's text")
    args = parser.parse_args()
    if args.record_routing:  # the hooks travel to the engine (another process under TP) as pickled functions,
        # by reference to an importable module (a function of __main__ does not unpickle in a worker)
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    from routing_hooks import record_routing, recorded_routing
    from vllm import LLM, SamplingParams

    kwargs = {k: v for k, v in (("quantization", args.quantization), ("linear_backend", args.linear_backend),
                                ("moe_backend", args.moe_backend)) if v}  # fmt: skip
    start = time.perf_counter()
    prompts = json.loads(open(args.prompts).read()) if args.prompts else PROMPTS
    llm = LLM(
        model=args.model, enforce_eager=True, skip_tokenizer_init=not args.detokenize, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=max(128, args.max_model_len), dtype="bfloat16", seed=0,
        tensor_parallel_size=args.tensor_parallel_size, **kwargs,
    )  # fmt: skip
    if args.record_routing:
        assert all(llm.apply_model(record_routing)), "--record-routing: the model has no MoE router (*.mlp.gate)"
    loaded = time.perf_counter()
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=0, logprobs=args.logprobs, prompt_logprobs=1, detokenize=args.detokenize
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    done = time.perf_counter()
    result = {"load_s": loaded - start, "generate_s": done - loaded, "requests": []}
    for out in outputs:
        gen = out.outputs[0]
        steps = [{str(t): lp.logprob for t, lp in step.items()} for step in gen.logprobs]
        prompt = [
            None if step is None else {str(t): lp.logprob for t, lp in step.items()} for step in out.prompt_logprobs
        ]
        result["requests"].append({"tokens": list(gen.token_ids), "logprobs": steps, "prompt_logprobs": prompt})
        if args.detokenize:
            result["requests"][-1]["text"] = gen.text
    if args.record_routing:  # routers are replicated on every rank: rank 0's record
        result["routing"] = llm.apply_model(recorded_routing)[0]
    from b12x_vllm import report  # the engine ran in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, TP=1)

    result["b12x"] = report.summary()
    result["layers"] = report.layer_types()
    result["quantization"] = llm.llm_engine.vllm_config.model_config.quantization
    generated = sum(len(r["tokens"]) for r in result["requests"])
    result["tokens_per_s"] = generated / max(done - loaded, 1e-9)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
