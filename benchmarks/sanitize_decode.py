"""A small run of every CUDA path for `compute-sanitizer --tool memcheck python benchmarks/sanitize_decode.py`:
every linear backend that can run each format × activation mode here, alone (GEMV, Triton tiles, dequantize + bf16
GEMM, cuBLASLt fp8 GEMMs; M = 1 .. 300), the fused MoE (every format × activation format, T = 1, 7, 64) and the
Q8_0 embedding."""

import numpy as np
import torch

import b12x_core as bc
import b12x_formats as bf
from b12x_core import backends, plan
from b12x_core.moe import MOE_FORMATS
from b12x_core.weights import DeviceWeights

rng = np.random.default_rng(0)
CASES = [(f, "bf16") for f in ("Q8_0", "IQ2_XXS", "IQ2_XS", "FP8", "FP8_BLOCK", "MXFP8", "NVFP4", "MXFP4")] + [
    ("FP8", "fp8"), ("FP8_BLOCK", "fp8"), ("MXFP8", "mxfp8"), ("NVFP4", "nvfp4"), ("MXFP4", "mxfp8"),
]  # fmt: skip
for fmt, act in CASES:
    qw = bf.quantize(rng.standard_normal((136, 512)).astype(np.float32), fmt)
    if act == "nvfp4":
        qw = bf.QuantizedWeight.from_tensors(fmt, {**qw.tensors, "input_scale": np.float32(0.01)})
    lin = bc.prepare_linear(qw, device="cuda", max_tokens=300, activation=act)
    for cls in backends.for_op("linear"):
        if not cls.can_implement(lin.plan.query)[0]:
            continue
        alone = plan.build(lin.plan.query, DeviceWeights([qw], lin.act_mode, lin.input_scale, lin.device), only=cls)
        for m in (1, 5, 16, 19, 40, 300):
            x = torch.randn(m, 512, dtype=torch.bfloat16, device="cuda")
            alone.for_tokens(m).run(x, torch.randn(136, device="cuda"))
for fmt, acts in MOE_FORMATS.items():
    w13, w2 = (
        bf.quantize(rng.standard_normal(shape).astype(np.float32), fmt) for shape in ((4, 512, 256), (4, 256, 256))
    )
    for act in acts:
        if act == "nvfp4":
            w13, w2 = (bf.QuantizedWeight.from_tensors(fmt, {**w.tensors, "input_scale": np.full(4, 0.01, np.float32)})
                       for w in (w13, w2))  # fmt: skip
        moe = bc.prepare_moe(w13, w2, device="cuda", max_tokens=64, top_k=2, act_format=act)
        for t in (1, 7, 64):
            weights, ids = bc.route_topk(torch.randn(t, 4, device="cuda"), 2)
            bc.moe(torch.randn(t, 256, dtype=torch.bfloat16, device="cuda"), weights, ids, moe)
emb = bc.prepare_embedding(bf.quantize(rng.standard_normal((50, 96)).astype(np.float32), "Q8_0"), device="cuda")
bc.embedding(torch.tensor([0, 49, 7], device="cuda"), emb)
torch.cuda.synchronize()
print("sanitize run complete")
