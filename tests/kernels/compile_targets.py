"""Compile the Triton kernels ahead of time for sm_90, sm_120a and sm_121a (no GPU needed) and print each
kernel's shared memory as JSON: the fused MoE's grouped GEMM at its prefill and split-K decode configurations, the
split epilogue, the combine, the routing-table kernel and the top-k routing kernel (its libdevice expf runs only
compiled); the linear tiles, the dequantize-to-bf16 passes (checkpoint and tensor-core layouts) of every format layout
and the activation quantizers (sm_90: they read the generated format constants, which only a real compile checks). A script, run in a fresh
process by test_triton_targets.py: the test session runs Triton in its interpreter, which cannot compile."""

from __future__ import annotations

import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from b12x_core.backends.triton_moe import tile_config
from b12x_core.backends.triton_tiles import tile_config as linear_tile_config
from b12x_formats.kernel_facts import LAYOUTS, format_id
from b12x_kernels import act_quant, mma_dequant, moe_route, tiles, topk_route

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
TOPK_SIGNATURE = {"logits_ptr": "*bf16", "weights_ptr": "*fp32", "ids_ptr": "*i32", "T": "i32", "E": "i32",
                  "stride_t": "i32", "stride_e": "i32"}  # fmt: skip


def compile_for(fn, signature: dict, constexprs: dict, arch: int, **options) -> int:
    """-> bytes of shared memory the compiled kernel uses."""
    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options).metadata.shared


def main() -> None:
    shared = {}
    for arch, smem_kb in TARGETS.items():
        # IQ2_XS with SiLU: two decoded weight tiles, the largest decode state
        for regime, rows_per_expert in (("prefill", 1000.0), ("decode", 1.0)):
            cfg = tile_config(rows_per_expert, "silu", smem_kb)
            const = dict(FMT=format_id("IQ2_XS"), GATHER=True, ACT=tiles.MOE_ACT["silu"], UP_FIRST=False,
                         SPLIT=regime == "decode", BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"],
                         BLOCK_K=tiles.BLOCK_K)  # fmt: skip
            sig = dict(MOE_SIGNATURE, y_ptr="*fp32" if regime == "decode" else "*bf16")
            opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
            shared[f"moe_tiles/{regime}/sm_{arch}"] = (compile_for(tiles._moe_tiles, sig, const, arch, **opts), smem_kb)
        others = [(tiles._moe_combine, COMBINE_SIGNATURE, dict(BLOCK_H=1024)),
                  (tiles._moe_activate, ACTIVATE_SIGNATURE, dict(ACT=1, UP_FIRST=True, BLOCK=512)),
                  (moe_route._moe_route, ROUTE_SIGNATURE, dict(EB=256, CH=moe_route._CHUNK)),
                  (topk_route._topk_route, TOPK_SIGNATURE, dict(K=8, RENORMALIZE=True, BT=8, EB=256, KB=8,
                                                                LIBDEVICE_EXP=True))]  # fmt: skip
        for fn, sig, const in others:
            shared[f"{fn.__name__}/sm_{arch}"] = (compile_for(fn, sig, const, arch, num_warps=4), smem_kb)
    shared.update(linear_kernels(90, TARGETS[90]))
    print(json.dumps(shared))


LINEAR_SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "grid_ptr": "*i64", "sign_ptr": "*u8",
                    "col_scale_ptr": "*fp32", "token_scale_ptr": "*fp32", "x_group_ptr": "*fp32", "bias_ptr": "*bf16",
                    "y_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32"}  # fmt: skip
DEQUANT_SIGNATURE = {"w_ptr": "*u8", "s_ptr": "*u8", "grid_ptr": "*i64", "sign_ptr": "*u8", "col_scale_ptr": "*fp32",
                     "out_ptr": "*bf16", "N": "i32", "K": "i32"}  # fmt: skip
QUANT_SIGNATURE = {"x_ptr": "*bf16", "q_ptr": "*u8", "scale_ptr": "*fp32", "M": "i32", "ROWS": "i32", "K": "i32",
                   "static_scale": "fp32", "SCALE_STRIDE_M": "i32", "SCALE_STRIDE_G": "i32"}  # fmt: skip
MX_SIGNATURE = {"x_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "K": "i32", "global_scale": "fp32"}
MMA_DEQUANT_SIGNATURE = {"codes_ptr": "*u8", "meta_ptr": "*u8", "meta2_ptr": "*u8", "block_scale_ptr": "*fp32",
                         "grid_ptr": "*i64", "sign_ptr": "*u8", "fields_ptr": "*i32", "row_factor_ptr": "*fp32",
                         "out_ptr": "*bf16", "N": "i32", "K": "i32", "CHUNKS": "i32"}  # fmt: skip


def mma_dequant_constants(name: str) -> tuple[dict, dict]:
    """(signature, constexprs) of the dequantization from the tensor-core layout for a format: its chunk and the scale
    bytes per row and chunk, read off a packed weight (one source: b12x_core.mma_layout)."""
    import numpy as np

    import b12x_formats as bf
    from b12x_core.tensor_core import geometry
    from b12x_core.tensor_core import layout as mma_layout

    kb = geometry.chunk_k(name)
    mw = mma_layout.pack(bf.quantize(np.ones((16, kb), np.float32), name))
    per_row = [0 if a is None else a.size // 16 for a in (mw.meta, mw.meta2)]
    e4m3 = "*fp8e4nv"
    sig = dict(
        MMA_DEQUANT_SIGNATURE, codes_ptr="*i32", meta_ptr=e4m3 if "NVFP4" in name else "*u8"
    )  # as dequantize_mma
    return sig, dict(FMT=format_id(name), KB=kb, META=per_row[0], META2=per_row[1])


def linear_kernels(arch: int, smem_kb: int) -> dict:
    out = {}
    cfg = linear_tile_config(4096, 8192, sms=132)  # a prefill call on an H200-sized part: 128×128 tiles
    for name in LAYOUTS:
        const = dict(FMT=format_id(name), X_FP8=False, TOKEN_SCALE=False, X_GROUPS=name == "FP8_BLOCK", HAS_BIAS=True,
                     BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=tiles.BLOCK_K, GROUP_M=cfg["GROUP_M"])  # fmt: skip
        opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        out[f"linear_tiles/{name}/sm_{arch}"] = (compile_for(tiles._linear_tiles, LINEAR_SIGNATURE, const, arch, **opts),
                                                 smem_kb)  # fmt: skip
        const = dict(FMT=format_id(name), BLOCK_N=64, BLOCK_K=tiles.BLOCK_K)
        out[f"dequantize_tiles/{name}/sm_{arch}"] = (compile_for(tiles._dequantize_tiles, DEQUANT_SIGNATURE, const,
                                                                 arch, num_warps=4), smem_kb)  # fmt: skip
        sig, const = mma_dequant_constants(name)
        rows, cpp, warps = mma_dequant.PROGRAM.get(name, mma_dequant.DEFAULT_PROGRAM)  # the program it launches
        out[f"dequantize_mma/{name}/sm_{arch}"] = (compile_for(mma_dequant._dequantize_mma, sig,
                                                               dict(const, ROWS=rows, CPP=cpp), arch,
                                                               num_warps=warps), smem_kb)  # fmt: skip
    # block sizes as act_quant.quantize_fp8 launches them; static codes with their scale column as ScaledMM asks
    for mode, values, column in ((2, False, False), (1, True, False), (0, True, False), (0, False, True)):
        block_m, block_k = (1, act_quant.TOKEN_BLOCK_K) if mode == 1 else (16, tiles.BLOCK_K)
        const = dict(MODE=mode, STATIC_COLUMN=column, VALUES=values, BLOCK_M=block_m, BLOCK_K=block_k)
        sig = dict(QUANT_SIGNATURE, q_ptr="*bf16" if values else "*u8")
        name = f"quantize_fp8/{mode}{'/column' if column else ''}/sm_{arch}"
        out[name] = (compile_for(act_quant._quantize_fp8, sig, const, arch, num_warps=4), smem_kb)
    for mode, group in ((0, 32), (1, 16)):
        const = dict(MODE=mode, GROUP=group, BLOCK_M=16, BLOCK_K=tiles.BLOCK_K)
        out[f"quantize/{mode}/sm_{arch}"] = (compile_for(act_quant._quantize, MX_SIGNATURE, const, arch, num_warps=4),
                                             smem_kb)  # fmt: skip
    return out


if __name__ == "__main__":
    main()
