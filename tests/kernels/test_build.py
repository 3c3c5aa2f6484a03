"""The extension builds for every target arch and imports on a machine without a GPU."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

b12x_kernels = pytest.importorskip("b12x_kernels")


def test_imports_and_reports_why_it_cannot_run():
    reason = b12x_kernels.unavailable_reason()
    if b12x_kernels._C is None:
        pytest.skip(reason)
    assert b12x_kernels.compiled_archs() == ["90", "120a", "121a"]
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    assert (reason == "") == has_gpu, reason
    if not has_gpu:
        assert reason.startswith("no CUDA device")


def cuobjdump(*args: str) -> str:
    """cuobjdump's output on the built extension (skips where the extension or the tool is missing)."""
    if b12x_kernels._C is None:
        pytest.skip(b12x_kernels.unavailable_reason())
    tool = shutil.which("cuobjdump") or next(iter(Path("/usr/local/cuda/bin").glob("cuobjdump")), None)
    if tool is None:  # CI: the nvidia-cuda-cuobjdump wheel (nox installs it)
        import importlib.util

        nvidia = importlib.util.find_spec("nvidia")
        roots = nvidia.submodule_search_locations if nvidia else []
        tool = next((p for root in roots for p in Path(root).glob("*/bin/cuobjdump")), None)
    if tool is None:
        pytest.skip("cuobjdump not found")
    env = dict(os.environ)
    if "-sass" in args:  # cuobjdump disassembles through nvdisasm, which its wheel lacks: Triton's wheel ships one
        disasm = _nvdisasm(Path(tool).parent)
        if disasm is None:
            pytest.skip("nvdisasm not found (cuobjdump -sass needs it)")
        env["PATH"] = f"{disasm.parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run([str(tool), *args, b12x_kernels._C.__file__], capture_output=True, text=True, env=env)
    assert done.returncode == 0, f"cuobjdump {' '.join(args)}: {done.stderr.strip()[-2000:]}"
    return done.stdout


def _nvdisasm(beside: Path) -> Path | None:
    """nvdisasm on PATH, in the CUDA kit, beside cuobjdump, or in Triton's wheel."""
    import importlib.util

    found = shutil.which("nvdisasm")
    if found:
        return Path(found)
    triton = importlib.util.find_spec("triton")
    places = [Path("/usr/local/cuda/bin"), beside]
    if triton and triton.submodule_search_locations:
        places += [Path(p) / "backends/nvidia/bin" for p in triton.submodule_search_locations]
    return next((p / "nvdisasm" for p in places if (p / "nvdisasm").is_file()), None)


def test_fat_binary_holds_sm90_sm120a_sm121a():
    listing = cuobjdump("--list-elf")
    for arch in ("sm_90", "sm_120a", "sm_121a"):
        assert f".{arch}." in listing, listing


def test_sm12x_tensor_core_kernels_keep_their_values_in_registers():
    """No SM12x GPU has run them, so what the CPU can hold them to is their code: no instance of the tensor-core GEMM
    (the mma.sync family, SM12x's) spills to a stack frame in the sm_120a / sm_121a code. Their register cap asks
    for the CTAs an SM12x's 100 KB of shared memory holds (mma_gemm.cuh min_blocks); asked for two where one fits,
    FP8_BLOCK at 32-token tiles spilled."""
    arch, name, seen = "", "", 0
    for line in cuobjdump("-res-usage").splitlines():
        if line.startswith("arch = "):
            arch = line.split()[-1]
        elif line.strip().startswith("Function ") and "mma_gemm_kernel" in line:
            name = line.strip()
        elif "REG:" in line and arch in ("sm_120a", "sm_121a") and name:
            usage = dict(field.split(":") for field in line.split())
            assert usage["STACK"] == "0" and usage["LOCAL"] == "0", f"{arch} {name} {line.strip()}"
            seen += 1
        if "REG:" in line:
            name = ""
    assert seen > 100, seen  # every format's instances, on both archs


def test_the_extension_counts_each_kernels_shared_memory_without_a_gpu():
    """mma_smem_bytes, the host count the plans keep every CTA within a GPU's shared memory by (SM12x: 99 KB a
    block): it grows with the token tile, the CTA height and the rows held, and is 0 for a kernel that does not
    exist (a 24-token tile, a short CTA past one-token tiles, rows held past one-token tiles)."""
    if b12x_kernels._C is None:
        pytest.skip(b12x_kernels.unavailable_reason())
    from b12x_formats.kernel_facts import format_id

    count = b12x_kernels.mma_smem_bytes
    for fmt in ("FP8", "FP8_BLOCK", "MXFP8", "NVFP4", "MXFP4", "Q8_0", "IQ2_XXS", "IQ2_XS"):
        f = format_id(fmt)
        assert 0 < count(f, 1) < count(f, 2) < count(f, 4), fmt
        assert 0 < count(f, 1, 6) < count(f, 1, 7) < count(f, 1, 8), fmt
        assert 0 < count(f, 1, 8, 1, 4) < count(f, 1, 8, 8, 4) < count(f, 1, 8, 8, 8), fmt
        assert count(f, 3) == count(f, 2, 7) == count(f, 2, 8, 8, 4) == 0, fmt
