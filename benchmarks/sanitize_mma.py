"""A small run of the tensor-core GEMM for
`compute-sanitizer --tool memcheck|racecheck|synccheck python benchmarks/sanitize_mma.py`: every format, token
tiles 1/2/4, row tiles 1/2, one and several K splits, tails in N, K and M, and on an sm_90 device its Hopper form
(wgmma_gemm: every format it runs, token tiles 8–128, K whole and split, its 256-row CTAs for FP4 at 64 and 128
tokens; FP8_BLOCK and IQ2 at 8-64 tokens); then its grouped form (the fused MoE backend tensor_core_moe) for
every MoE format, SiLU and ReLU², decode-sized (split K) and larger calls. `--formats IQ2_XS,FP8_BLOCK` runs only
those formats (in both parts)."""

import argparse

import numpy as np
import torch

import b12x_core as bc
import b12x_formats as bf
from b12x_core import plan
from b12x_core.backends.tensor_core_moe import TensorCoreMoE
from b12x_core.tensor_core import gemm, geometry, wgmma
from b12x_core.weights import DeviceWeights

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--formats", default="FP8,FP8_BLOCK,MXFP8,NVFP4,MXFP4,Q8_0,IQ2_XXS,IQ2_XS")
formats = parser.parse_args().formats.split(",")
rng = np.random.default_rng(0)
stream = torch.cuda.current_stream().cuda_stream
for fmt in formats:
    n, k = 136, 5 * geometry.chunk_k(fmt) + (256 if fmt.startswith("IQ2") else 32)
    shards = gemm.prepare([bf.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt)], "cuda")
    for m in (1, 13, 40):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        one_token = (gemm.MmaConfig(1, 1), gemm.MmaConfig(1, 3, tiles=7))  # 7: balanced_config's CTA heights
        for config in (*one_token, gemm.MmaConfig(2, 3, 2), gemm.MmaConfig(4, 6)):
            ws = gemm.MmaWorkspace.create(m, n, config.splits, config.mt, "cuda", row_tiles=config.tiles)
            gemm.run(x, shards, y, torch.randn(n, device="cuda").to(torch.bfloat16), config, ws, stream)
        if fmt in wgmma.LINEAR_FORMATS and torch.cuda.get_device_capability() == wgmma.CAPABILITY:
            staged = torch.empty(wgmma.staged_bytes(fmt, m, k), dtype=torch.uint8, device="cuda")
            configs = (gemm.MmaConfig(1, 1), gemm.MmaConfig(4, 3), gemm.MmaConfig(8, 1), gemm.MmaConfig(16, 6))
            if fmt in wgmma.FACTOR_FORMATS:  # token tiles up to 64
                configs = (gemm.MmaConfig(1, 1), gemm.MmaConfig(4, 3), gemm.MmaConfig(8, 2))
            if fmt in wgmma.WIDE_FORMATS:  # 256-row CTAs: N = 136 is a tail of one CTA's rows
                configs += tuple(gemm.MmaConfig(mt, s, tiles=wgmma.WIDE_TILES) for mt, s in ((8, 1), (16, 3)))
            for config in configs:
                ws = gemm.MmaWorkspace.create(m, n, config.splits, config.mt, "cuda", row_tiles=config.tiles)
                wgmma.run(x, shards, y, None, config, ws, staged, stream)

e, h = 8, 512
for fmt in [f for f in ("NVFP4", "MXFP4", "Q8_0", "IQ2_XXS", "IQ2_XS") if f in formats]:
    inter = 256
    for activation in ("silu", "relu2"):
        rows = 2 * inter if activation == "silu" else inter
        w13 = bf.quantize(rng.standard_normal((e, rows, h)).astype(np.float32) / h**0.5, fmt)
        w2 = bf.quantize(rng.standard_normal((e, h, inter)).astype(np.float32) / inter**0.5, fmt)
        p = bc.prepare_moe(w13, w2, activation=activation, max_tokens=40, top_k=2, device="cuda")
        weights = (
            DeviceWeights([w13], p.act_mode_13, None, p.device),
            DeviceWeights([w2], p.act_mode_2, None, p.device),
        )
        moe = plan.build(p.plan.query, weights, only=TensorCoreMoE)
        for t in (1, 3, 40):
            x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
            topk_weights, ids = bc.route_topk(torch.randn(t, e, device="cuda"), 2)
            moe.for_tokens(t).run(x, topk_weights, ids)
torch.cuda.synchronize()
print("sanitize run complete")
