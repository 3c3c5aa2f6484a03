"""A few launches of the tensor-core GEMM for Nsight Compute (one per case, after a warm-up launch):

    ncu --clock-control none -k regex:mma_gemm --launch-skip-before-match 0 --section SpeedOfLight \
        --section WarpStateStats --section Occupancy python benchmarks/mma_profile.py [FMT:NxK:M:MT:SPLITS ...]

MT:SPLITS "auto:auto" takes the configuration the tensor-core backend runs (configure.default_config on this device); a
sixth field "resident" or "staged" sets MmaConfig.resident (one-token tiles: activations held whole or in stages).
"""

from __future__ import annotations

import dataclasses
import sys

import torch
from mma_linear import random_shard

from b12x_core.tensor_core import configure, gemm, geometry

CASES = ["FP8:8192x28672:1:1:4", "NVFP4:57344x8192:1:1:1", "NVFP4:8192x28672:1:1:4", "IQ2_XS:8192x28672:1:1:4",
         "Q8_0:8192x28672:1:1:4", "NVFP4:57344x8192:32:4:1"]  # fmt: skip

for case in sys.argv[1:] or CASES:
    fmt, shape, m, mt, splits, *held = case.split(":")
    n, k = map(int, shape.split("x"))
    m = int(m)
    if mt == "auto":
        chunks = -(-k // geometry.chunk_k(fmt))
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        ctas = geometry.concurrent_ctas_here(fmt, configure.token_tile(m), "cuda")
        config = configure.default_config(m, n, chunks, ctas, sms=sms, share=configure.split_share(fmt, m, k), fmt=fmt)
    else:
        config = gemm.MmaConfig(int(mt), int(splits))
    if held:
        config = dataclasses.replace(config, resident=held[0] == "resident")
    shard = random_shard(fmt, n, k)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    ws = gemm.MmaWorkspace.create(m, n, config.splits, config.mt, "cuda", row_tiles=config.tiles)
    for _ in range(2):
        gemm.run(x, [shard], y, None, config, ws, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    print(case, config, "done", flush=True)
