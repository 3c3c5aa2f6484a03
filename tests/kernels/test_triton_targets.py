"""The Triton kernels compile ahead of time without a GPU: the fused-MoE kernels for every target b12x ships
(sm_90, sm_120a, sm_121a), the largest configuration each target picks fitting its shared memory (SM12x parts
allow 99 KB per block, so a configuration tuned on the H200 must not fail to launch there); the linear tiles,
dequantize-to-bf16 pass and activation quantizers for every format layout (they read the generated format constants,
which the interpreter does not check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_triton_kernels_compile_and_fit_each_target():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # conftest sets it for this process
    script = Path(__file__).with_name("compile_targets.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    shared = json.loads(done.stdout.strip().splitlines()[-1])
    from b12x_formats.kernel_facts import LAYOUTS

    assert len(shared) == 18 + 3 * len(LAYOUTS) + 6
    for kernel, (nbytes, smem_kb) in shared.items():
        assert 0 <= nbytes <= smem_kb * 1024, (kernel, nbytes)
