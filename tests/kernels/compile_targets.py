"""Compile the fused-MoE Triton kernels ahead of time for sm_90, sm_120a and sm_121a (no GPU needed) and print
each kernel's shared memory as JSON: the grouped GEMM at its prefill and split-K decode configurations, the
split epilogue, the combine and the routing kernel. A script, run in a fresh process by test_triton_targets.py: the test
session runs Triton in its interpreter, which cannot compile."""

from __future__ import annotations

import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from b12x_kernels import moe_route, tiles

TARGETS = {90: 228, 120: 99, 121: 99}  # compute capability: KB of shared memory per block
MOE_SIGNATURE = {"x_ptr": "*bf16", "sorted_ptr": "*i32", "block_expert_ptr": "*i32", "block_start_ptr": "*i32",
                 "block_rows_ptr": "*i32", "w_ptr": "*u8", "s_ptr": "*u8", "grid_ptr": "*i64", "sign_ptr": "*u8",
                 "col_scale_ptr": "*fp32", "y_ptr": "*bf16", "N": "i32", "K": "i32", "TOP_K": "i32",
                 "ROWS_PER_EXPERT": "i32", "Y_ROWS": "i32", "K_SPLIT": "i32"}  # fmt: skip
COMBINE_SIGNATURE = {"out_ptr": "*fp32", "weights_ptr": "*fp32", "y_ptr": "*bf16", "H": "i32", "TOP_K": "i32",
                     "SPLITS": "i32", "SLOTS": "i32"}  # fmt: skip
ACTIVATE_SIGNATURE = {"part_ptr": "*fp32", "y_ptr": "*bf16", "ROWS": "i32", "N": "i32", "SPLITS": "i32"}
ROUTE_SIGNATURE = {"ids_ptr": "*i32", "order_ptr": "*i32", "block_expert_ptr": "*i32", "block_start_ptr": "*i32",
                   "block_rows_ptr": "*i32", "SLOTS": "i32", "E": "i32", "MOST": "i32", "BM": "i32"}  # fmt: skip


def compile_for(fn, signature: dict, constexprs: dict, arch: int, **options) -> int:
    """-> bytes of shared memory the compiled kernel uses."""
    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options).metadata.shared


def main() -> None:
    shared = {}
    for arch, smem_kb in TARGETS.items():
        # IQ2_XS with SiLU: two decoded weight tiles, the largest decode state
        for regime, rows_per_expert in (("prefill", 1000.0), ("decode", 1.0)):
            cfg = tiles.moe_config(rows_per_expert, "silu", smem_kb)
            const = dict(FMT=tiles._CODE["IQ2_XS"], GATHER=True, ACT=tiles.MOE_ACT["silu"], UP_FIRST=False,
                         SPLIT=regime == "decode", BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"],
                         BLOCK_K=tiles.BLOCK_K)  # fmt: skip
            sig = dict(MOE_SIGNATURE, y_ptr="*fp32" if regime == "decode" else "*bf16")
            opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
            shared[f"moe_tiles/{regime}/sm_{arch}"] = (compile_for(tiles._moe_tiles, sig, const, arch, **opts), smem_kb)
        others = [(tiles._moe_combine, COMBINE_SIGNATURE, dict(BLOCK_H=1024)),
                  (tiles._moe_activate, ACTIVATE_SIGNATURE, dict(ACT=1, UP_FIRST=True, BLOCK=512)),
                  (moe_route._moe_route, ROUTE_SIGNATURE, dict(EB=256, CH=moe_route._CHUNK))]  # fmt: skip
        for fn, sig, const in others:
            shared[f"{fn.__name__}/sm_{arch}"] = (compile_for(fn, sig, const, arch, num_warps=4), smem_kb)
    print(json.dumps(shared))


if __name__ == "__main__":
    main()
