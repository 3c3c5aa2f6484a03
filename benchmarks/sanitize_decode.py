"""A small run of every CUDA path for `compute-sanitizer --tool memcheck python benchmarks/sanitize_decode.py`."""

import numpy as np
import torch

import b12x_core as bc
import b12x_formats as bf

rng = np.random.default_rng(0)
for fmt in ("Q8_0", "IQ2_XXS", "IQ2_XS"):
    qw = bf.quantize(rng.standard_normal((136, 512)).astype(np.float32), fmt)
    lin = bc.prepare_linear(qw, device="cuda", max_tokens=32)
    for m in (1, 5, 16, 19):
        bc.linear(torch.randn(m, 512, dtype=torch.bfloat16, device="cuda"), lin, torch.randn(136, device="cuda"))
emb = bc.prepare_embedding(bf.quantize(rng.standard_normal((50, 96)).astype(np.float32), "Q8_0"), device="cuda")
bc.embedding(torch.tensor([0, 49, 7], device="cuda"), emb)
torch.cuda.synchronize()
print("sanitize run complete")
