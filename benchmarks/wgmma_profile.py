"""A few launches of the Hopper wgmma prototype for Nsight Compute (one per case, after a warm-up launch):

    ncu --clock-control none -k regex:wgmma_gemm --launch-skip 1 --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats python benchmarks/wgmma_profile.py [FMT:NxK:M:NT ...]
"""

from __future__ import annotations

import sys

import torch
from wgmma_linear import shard

from b12x_core.tensor_core import wgmma

CASES = ["NVFP4:28672x4096:1024:16", "NVFP4:4096x4096:64:4"]

for case in sys.argv[1:] or CASES:
    fmt, size, m, nt = case.split(":")
    n, k = map(int, size.split("x"))
    m, nt = int(m), int(nt)
    s = shard(fmt, n, k)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(2):
        wgmma.run(x, [s], y, None, nt, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    print(case, "done", flush=True)
