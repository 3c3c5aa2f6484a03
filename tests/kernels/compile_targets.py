"""Compile the fused-MoE Triton kernels ahead of time for sm_90, sm_120a and sm_121a (no GPU needed) and print
each kernel's shared memory as JSON. A script, run in a fresh process by test_triton_targets.py: the test
session runs Triton in its interpreter, which cannot compile."""

from __future__ import annotations

import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from b12x_kernels import tiles

TARGETS = {90: 228, 120: 99, 121: 99}  # compute capability: KB of shared memory per block
MOE_SIGNATURE = {"x_ptr": "*bf16", "sorted_ptr": "*i32", "block_expert_ptr": "*i32", "block_start_ptr": "*i32",
                 "block_rows_ptr": "*i32", "w_ptr": "*u8", "s_ptr": "*u8", "grid_ptr": "*i64", "sign_ptr": "*u8",
                 "col_scale_ptr": "*fp32", "y_ptr": "*bf16", "N": "i32", "K": "i32", "TOP_K": "i32",
                 "ROWS_PER_EXPERT": "i32"}  # fmt: skip
COMBINE_SIGNATURE = {"out_ptr": "*fp32", "weights_ptr": "*fp32", "y_ptr": "*bf16", "H": "i32", "TOP_K": "i32"}


def compile_for(fn, signature: dict, constexprs: dict, arch: int, **options) -> int:
    """-> bytes of shared memory the compiled kernel uses."""
    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options).metadata.shared


def main() -> None:
    shared = {}
    for arch, smem_kb in TARGETS.items():
        # IQ2_XS with SiLU at the prefill configuration: two decoded weight tiles, the largest decode state
        cfg = tiles.moe_config(1000.0, "silu", smem_kb)
        const = dict(FMT=tiles._CODE["IQ2_XS"], GATHER=True, ACT=tiles.MOE_ACT["silu"], UP_FIRST=False,
                     BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"], BLOCK_K=tiles.BLOCK_K)  # fmt: skip
        opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        shared[f"moe_tiles/sm_{arch}"] = (compile_for(tiles._moe_tiles, MOE_SIGNATURE, const, arch, **opts), smem_kb)
        combine = compile_for(tiles._moe_combine, COMBINE_SIGNATURE, dict(BLOCK_H=1024), arch, num_warps=4)
        shared[f"moe_combine/sm_{arch}"] = (combine, smem_kb)
    print(json.dumps(shared))


if __name__ == "__main__":
    main()
