"""A few launches of the Hopper tensor-core GEMM (wgmma form) for Nsight Compute (one per case, after a warm-up):

    ncu --clock-control none -k regex:wgmma_gemm --launch-skip 1 --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats python benchmarks/wgmma_profile.py [FMT:NxK:M:MT:SPLITS ...]
"""

from __future__ import annotations

import sys

import torch
from wgmma_linear import shard

from b12x_core.tensor_core import gemm, wgmma

CASES = ["NVFP4:28672x4096:1024:16:1", "NVFP4:4096x4096:64:8:2"]

for case in sys.argv[1:] or CASES:
    fmt, size, m, mt, splits = case.split(":")
    n, k = map(int, size.split("x"))
    m, config = int(m), gemm.MmaConfig(int(mt), int(splits))
    s = shard(fmt, n, k)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    ws = gemm.MmaWorkspace.create(m, n, config.splits, config.mt, "cuda")
    staged = torch.empty(wgmma.staged_bytes(fmt, m, k), dtype=torch.uint8, device="cuda")
    for _ in range(2):
        wgmma.run(x, [s], y, None, config, ws, staged, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    print(case, "done", flush=True)
