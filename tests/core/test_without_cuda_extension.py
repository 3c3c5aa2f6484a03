"""An install of b12x-kernels without its CUDA extension (built where no CUDA compiler was found): on a CUDA
device the Triton paths still run, the CUDA-only ones refuse with the reason, and prepare says once, in one
line, that the CUDA kernels are not built and how to get them. Never a silent slow path.

No GPU is needed: dispatch decides from the query and from what is installed, both faked here.
"""

import logging
import sys
import types

import pytest
import torch

import b12x_core as bc
from b12x_core import cuda_paths
from b12x_core.dispatch import Query, choose

CUDA = torch.device("cuda", 0)


@pytest.fixture
def no_extension(monkeypatch):
    import b12x_kernels

    info = types.ModuleType("b12x_kernels._build_info")
    info.NO_CUDA_REASON = "no CUDA compiler was found when it was built (nvcc: CUDACXX, PATH or /usr/local/cuda)"
    monkeypatch.setitem(sys.modules, "b12x_kernels._build_info", info)
    monkeypatch.setattr(b12x_kernels, "_C", None)
    monkeypatch.setattr(b12x_kernels, "_IMPORT_ERROR", "No module named 'b12x_kernels._C'")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_paths, "_warned", False)
    pytest.importorskip("triton")


def test_triton_paths_run_and_prepare_says_once_what_is_missing(no_extension, caplog):
    with caplog.at_level(logging.WARNING, logger="b12x_core"):
        assert choose(Query("linear", "IQ2_XS", "bf16", CUDA, "auto", k=256)) == "triton_tiles"
        assert choose(Query("moe", "MXFP4", "bf16", CUDA, "auto")) == "triton_moe"
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1, lines
    assert "\n" not in lines[0]
    assert "CUDA kernels are not built: no CUDA compiler was found" in lines[0]
    assert "pip install --force-reinstall --no-deps packages/b12x-kernels" in lines[0]


def test_cuda_only_paths_refuse_and_name_the_missing_build(no_extension):
    with pytest.raises(bc.UnsupportedError, match="cuda_embedding_q8_0: the CUDA kernels are not built"):
        choose(Query("embedding", "Q8_0", "bf16", CUDA, "auto"))


def test_an_install_with_the_extension_says_nothing(monkeypatch, caplog):
    import b12x_kernels

    monkeypatch.setattr(b12x_kernels, "_C", object())
    monkeypatch.setattr(cuda_paths, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="b12x_core"):
        cuda_paths.warn_if_not_built()
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
