"""`nox -s demo -- --serve` (b12x_vllm/serve.py), on the tiny Llama instead of SmolLM2 (CI time): the demo quantizes
the model, becomes vLLM's OpenAI server, and every client line it prints works as printed."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("vllm")

from vllm_server import HOST, START_S, free_port, kill_group  # noqa: E402

from b12x_vllm import serve  # noqa: E402

CLIENT_S = 120


def test_the_demo_serves_and_its_printed_lines_work(tiny_models, tmp_path):
    model = shutil.copytree(tiny_models["llama"].quantized.parent / "hf", tmp_path / "model")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"  # a real model has one
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    port = free_port()
    log = tmp_path / "demo.log"
    cmd = [sys.executable, "-m", "b12x_vllm.demo", "--model", str(model), "--out", str(tmp_path / "out"), "--serve",
           "--port", str(port)]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_S
        while not ready(port):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-6000:]
            time.sleep(0.5)
        printed = [line.strip() for line in log.read_text().splitlines()]
        lines = serve.client_lines(HOST, port)
        assert all(line in printed for line in lines), printed[:40]
        for line in lines:
            args = shlex.split(line)
            args[0] = sys.executable if args[0] == "python" else args[0]  # `python` is this environment's
            done = subprocess.run(args, capture_output=True, text=True, timeout=CLIENT_S)
            assert done.returncode == 0 and done.stdout.strip(), (line, done.stdout, done.stderr[-3000:])
            if line.startswith("curl"):
                assert json.loads(done.stdout)["choices"][0]["finish_reason"] in ("length", "stop"), done.stdout
    finally:
        kill_group(proc)
    assert "quantization=b12x" in log.read_text()


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
