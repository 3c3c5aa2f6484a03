"""FP8_BLOCK W8A8 through torch's block-wise scaled FP8 GEMM (b12x_core.backends.cublas.BlockScaledMM): its scale
conventions against the reference. 1×128 activation groups and 128×128 weight blocks of very different
magnitudes, so a transposed, row-major or misaligned scale tensor shows up as a large error; fused shards of
different heights, so the stacked scale grid must line up with the rows. Tolerance: closeness.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from closeness import close

import b12x_core as bc
import b12x_formats as bf

pytestmark = pytest.mark.gpu


def blocky(rng, n, k):
    """Random [n, k] weights whose 128×128 blocks differ in scale by up to 2^±6."""
    w = rng.standard_normal((n, k)) / np.sqrt(k)
    scale = np.exp2(rng.uniform(-6, 6, size=(-(-n // 128), -(-k // 128))))
    return (w * np.repeat(np.repeat(scale, 128, 0)[:n], 128, 1)[:, :k]).astype(np.float32)


@pytest.mark.parametrize("m", [1, 5, 16, 100, 512])
@pytest.mark.parametrize("rows", [(256,), (128, 384)], ids=str)
def test_block_scaled_mm_matches_reference(rng, m, rows):
    from b12x_core import plan
    from b12x_core.backends.cublas import BlockScaledMM
    from b12x_core.weights import DeviceWeights

    k = 1024  # K/128 a multiple of 4 (cuBLASLt's block-scale layout; other K go to other backends)
    shards = [bf.quantize(blocky(rng, r, k), "FP8_BLOCK") for r in rows]
    x = (
        rng.standard_normal((m, k))
        * np.exp2(rng.uniform(-5, 5, size=(m, 1)))
        * np.repeat(np.exp2(rng.uniform(-5, 5, size=(1, k // 128))), 128, 1)
    )  # every token and every 128-column group on its own scale
    x = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    gpu = bc.prepare_linear(shards, device="cuda", max_tokens=m, activation="fp8")
    ok, why = BlockScaledMM.can_implement(gpu.plan.query)
    if not ok:
        pytest.skip(why)
    single = plan.build(gpu.plan.query, DeviceWeights(shards, gpu.act_mode, None, gpu.device), only=BlockScaledMM)
    bias = torch.from_numpy(rng.standard_normal(sum(rows)).astype(np.float32)).to(torch.bfloat16)
    y = single.for_tokens(m).run(x.cuda(), bias.cuda())
    close(y, bc.linear(x, bc.prepare_linear(shards, max_tokens=m, activation="fp8"), bias))
    assert torch.equal(single.for_tokens(m).run(x.cuda(), bias.cuda()), y)  # deterministic
