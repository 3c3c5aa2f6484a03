"""A small run of the tensor-core GEMM for
`compute-sanitizer --tool memcheck|racecheck|synccheck python benchmarks/sanitize_mma.py`: every format, token
tiles 1/2/4, row tiles 1/2, one and several K splits, tails in N, K and M."""

import numpy as np
import torch

import b12x_formats as bf
from b12x_core import mma_layout, mma_path

rng = np.random.default_rng(0)
stream = torch.cuda.current_stream().cuda_stream
for fmt in ("FP8", "FP8_BLOCK", "MXFP8", "NVFP4", "MXFP4", "Q8_0", "IQ2_XXS", "IQ2_XS"):
    n, k = 136, 5 * mma_layout.chunk_k(fmt) + (256 if fmt.startswith("IQ2") else 32)
    shards = mma_path.prepare([bf.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt)], "cuda")
    for m in (1, 13, 40):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        for config in (mma_path.MmaConfig(1, 1), mma_path.MmaConfig(2, 3, 2), mma_path.MmaConfig(4, 6)):
            ws = mma_path.MmaWorkspace.create(m, n, config.splits, config.mt, "cuda")
            mma_path.run(x, shards, y, torch.randn(n, device="cuda").to(torch.bfloat16), config, ws, stream)
torch.cuda.synchronize()
print("sanitize run complete")
