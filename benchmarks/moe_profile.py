"""A few calls of the dispatched fused MoE for Nsight Compute (one per case, after a warm-up call): what bounds the
tensor-core MoE at decode-sized token counts (at one token the Qwen3-like layer reads at a fifth of its touched
experts' copy floor, the gpt-oss-like one at a third, the DeepSeek-V3-like one at half: benchmarks/moe.py):

    ncu --clock-control none -k regex:mma_gemm --launch-skip-before-match 0 --section SpeedOfLight \
        --section WarpStateStats --section Occupancy --section LaunchStats \
        python benchmarks/moe_profile.py [SHAPE:FMT:ACT:T ...] [--device cpu]

Each case prints the plan's row for its token count (backend, slots a table block, both GEMMs' K splits, CTA rows,
routing) and, for the tensor-core MoE, the warps each grouped GEMM gives a scheduler: one warp streams one 16-row
tile of one touched expert's weight (per K split), so the Qwen3-like layer's small experts give the H200's 528
schedulers 1.5-2 warps at one token where the DeepSeek-V3-like layer's give 4-7; read a profile beside that count.
Shapes are benchmarks/moe.py's, plus "tiny" (8 experts, top-2, H = I = 256: the CPU smoke test's).
"""

from __future__ import annotations

import argparse

import torch
from decode_linear import random_weight, reuse_repacks
from moe import SHAPES

import b12x_core as bc
from b12x_core.tensor_core import geometry

CASES = ["qwen3:NVFP4:bf16:1", "qwen3:MXFP4:mxfp8:1", "gptoss:MXFP4:mxfp8:1", "dsv3:NVFP4:nvfp4:1",
         "qwen3:NVFP4:bf16:4"]  # fmt: skip
PROFILE_SHAPES = {**SHAPES, "tiny": (8, 2, 256, 256)}


def warps_per_scheduler(config: dict, touched: int, rows: tuple[int, int], sms: int) -> list[float]:
    """The warps of each grouped GEMM (gate/up, down) over the device's schedulers (4 an SM): the touched experts'
    16-row tiles (`rows`: each GEMM's rows an expert) times the GEMM's K splits."""
    pairs = zip(rows, config["splits"], strict=True)
    return [touched * -(-n // geometry.TILE_ROWS) * splits / (4 * sms) for n, splits in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", default=CASES, help="SHAPE:FORMAT:ACTIVATION:TOKENS")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    reuse_repacks()
    for case in args.cases:
        shape, fmt, act, t = case.split(":")
        e, k, h, inter, t = *PROFILE_SHAPES[shape], int(t)
        w13, w2 = random_weight(fmt, 2 * inter, h, (e,)), random_weight(fmt, h, inter, (e,))
        p = bc.prepare_moe(w13, w2, max_tokens=t, top_k=k, act_format=act, device=args.device)
        weights, ids = bc.route_topk(torch.randn(t, e, device=args.device), k)
        x = torch.randn(t, h, dtype=torch.bfloat16, device=args.device)
        bc.moe(x, weights, ids, p)  # warm-up: compiles, fills the workspace
        if args.device == "cuda":
            torch.cuda.synchronize()
        bc.moe(x, weights, ids, p)  # the profiled call
        row = p.plan.for_tokens(t)
        line = f"{case}: {row.backend.name} {row.config}"
        if "splits" in row.config:
            sms = p.plan.query.device.sms
            touched = int(torch.unique(ids).numel())
            per = warps_per_scheduler(row.config, touched, (2 * inter, h), sms)
            line += f"; {touched} experts touched, warps a scheduler: gate/up {per[0]:.2f}, down {per[1]:.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
