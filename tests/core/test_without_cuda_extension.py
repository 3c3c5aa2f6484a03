"""An install of b12x-kernels without its CUDA extension (built where no CUDA compiler was found): on a CUDA
device the Triton paths still run, the CUDA-only ones refuse with the reason, and prepare says once, in one
line, that the CUDA kernels are not built and how to get them. Never a silent slow path.

No GPU is needed: the plan decides from the query and from what is installed, both faked here.
"""

import logging
import sys
import types

import pytest
import torch

import b12x_core as bc
from b12x_core import plan
from b12x_core.backends import DeviceInfo, MoEShape, Query
from b12x_core.plan import choosing

CUDA = torch.device("cuda", 0)


def device_without_extension() -> DeviceInfo:
    import b12x_kernels

    return DeviceInfo(CUDA, (9, 0), sms=132, smem_kb=227, kernels=b12x_kernels.unavailable_reason())


@pytest.fixture
def no_extension(monkeypatch):
    import b12x_kernels

    info = types.ModuleType("b12x_kernels._build_info")
    info.NO_CUDA_REASON = "no CUDA compiler was found when it was built (nvcc: CUDACXX, PATH or /usr/local/cuda)"
    monkeypatch.setitem(sys.modules, "b12x_kernels._build_info", info)
    monkeypatch.setattr(b12x_kernels, "_C", None)
    monkeypatch.setattr(b12x_kernels, "_IMPORT_ERROR", "No module named 'b12x_kernels._C'")
    monkeypatch.setattr(choosing, "_logged", set())  # say the missing build again
    pytest.importorskip("triton")


def test_triton_paths_run_and_prepare_says_once_what_is_missing(no_extension, caplog):
    device = device_without_extension()
    moe = MoEShape(8, 256, 512, 2, "silu", "gate_up", "bf16", "MXFP4")
    with caplog.at_level(logging.WARNING, logger="b12x_core"):
        _, _, linear = plan.choose(Query("linear", "IQ2_XS", "bf16", "bf16", device, k=256, n=256, max_tokens=64))
        _, _, fused = plan.choose(Query("moe", "MXFP4", "bf16", "bf16", device, max_tokens=64, moe=moe))
    assert {d.backend.name for d in linear} <= {"triton_tiles", "dequant_gemm"}
    assert {d.backend.name for d in fused} == {"triton_moe"}
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1, lines
    assert "\n" not in lines[0]
    assert "CUDA kernels are not built: no CUDA compiler was found" in lines[0]
    assert "pip install --force-reinstall --no-deps packages/b12x-kernels" in lines[0]


def test_cuda_only_paths_refuse_and_name_the_missing_build(no_extension):
    with pytest.raises(bc.UnsupportedError, match="cuda_embedding_q8_0: the CUDA kernels are not built"):
        plan.choose(Query("embedding", "Q8_0", "bf16", "bf16", device_without_extension()))


def test_an_install_with_the_extension_says_nothing(monkeypatch, caplog):
    import b12x_kernels

    monkeypatch.setattr(b12x_kernels, "_C", object())
    monkeypatch.setattr(choosing, "_logged", set())  # say the missing build again
    with caplog.at_level(logging.WARNING, logger="b12x_core"):
        plan.warn_if_not_built(Query("linear", "IQ2_XS", "bf16", "bf16", DeviceInfo(CUDA, (9, 0)), k=256, n=256))
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
