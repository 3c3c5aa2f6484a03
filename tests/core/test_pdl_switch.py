"""B12X_PDL: programmatic dependent launch is off unless asked for, and the switch reaches the kernels' argument blocks
when a weight is prepared (the GPU side, that it changes no result: tests/kernels/test_pdl.py)."""

from __future__ import annotations

import numpy as np
import pytest

import b12x_formats as bf
from b12x_core import pdl
from b12x_core.tensor_core import gemm
from b12x_kernels import interface


@pytest.mark.parametrize("value,expect", [(None, 0), ("0", 0), ("1", 1), (" 1 ", 1), ("yes", 0)])
def test_pdl_is_off_unless_asked_for(monkeypatch, value, expect):
    if value is None:
        monkeypatch.delenv("B12X_PDL", raising=False)
    else:
        monkeypatch.setenv("B12X_PDL", value)
    assert pdl.enabled() == expect


@pytest.mark.parametrize("flag", ["0", "1"])
def test_the_switch_is_read_at_prepare_time_into_the_argument_block(rng, monkeypatch, flag):
    qw = bf.quantize(rng.standard_normal((32, 256)).astype(np.float32), "NVFP4")
    monkeypatch.setenv("B12X_PDL", flag)
    (shard,) = gemm.prepare([qw], "cpu")
    monkeypatch.setenv("B12X_PDL", "0" if flag == "1" else "1")  # later changes do not reach a prepared weight
    block = interface.MmaArgs.from_buffer_copy(shard.args(gemm.MmaConfig(1, 1), ldy=32))
    assert block.pdl == int(flag) and block.N == 32 and block.K == 256
