"""b12x device code: CUDA C++ kernels behind a narrow pointer-based binding (`b12x_kernels._C`).

Imports on machines without a GPU (or without the built extension: an install without a CUDA compiler has
only the Triton kernels): `available()` says whether kernels can run here, `unavailable_reason()` why not and
`not_built_reason()` whether the extension is missing and how to get it. No dispatch policy lives here:
b12x_core decides what runs and with which configuration (the GEMVs' `max_m` accumulator bucket, the Triton
tiles' block sizes, the tensor-core GEMM's token tile and K splits). Format numbers come from b12x_formats; each
family's argument block and the tensor-core geometry from `interface` (csrc/interface.h is generated from it).
"""

from __future__ import annotations

__version__ = "0.1.0"

HOW_TO_BUILD = (
    "install b12x-kernels where nvcc is found (CUDACXX, PATH or /usr/local/cuda): "
    "pip install --force-reinstall --no-deps packages/b12x-kernels from the b12x repository, "
    "or its Linux x86_64 wheel"
)

try:
    from . import _C
except ImportError as err:  # built without CUDA, or not built
    _C = None
    _IMPORT_ERROR = str(err)
else:
    _IMPORT_ERROR = ""


def not_built_reason() -> str:
    """Why this install has no CUDA extension ('' when it has one): the build's own record, else the import error."""
    if _C is not None:
        return ""
    try:
        from ._build_info import NO_CUDA_REASON
    except ImportError:  # a source tree that was never built
        NO_CUDA_REASON = ""
    return f"the CUDA kernels are not built: {NO_CUDA_REASON or _IMPORT_ERROR}; to get them, {HOW_TO_BUILD}"


def unavailable_reason() -> str:
    """Why kernels cannot run here, or '' when they can."""
    if _C is None:
        return not_built_reason()
    count, error = _C.device_count()
    return "" if count > 0 else f"no CUDA device ({error})"


def available() -> bool:
    return unavailable_reason() == ""


def compiled_archs() -> list[str]:
    return [] if _C is None else _C.compiled_archs().split(",")


def _needs_build(name: str):
    def call(*args, **kwargs):
        raise RuntimeError(f"b12x_kernels.{name}: {not_built_reason()}")

    return call


# One binding per kernel family (csrc/module.cpp): the family's argument block (interface.pack, built once at prepare
# time), then only what changes per call. Pointers are device addresses (0: none), stream a CUDA stream handle.
#   gemv_ggml(args: GemvGgmlArgs, x, bias, y, m, stream)
#   gemv_elem(args: GemvElemArgs, x, x_scale, bias, y, m, stream)     x_scale: float32 [m, args.x_scale_cols] or 0
#   mma_gemm(args: MmaArgs, x, bias, y, m, partials, tickets, stream, order=0, table=0, blocks=0)
#       grouped (fused MoE) when `order` is set: the expert-sorted block table (csrc/kernels.h MmaCall)
#   wgmma_gemm(args: MmaArgs, x, bias, y, m, partials, tickets, staged, stream)   the Hopper (sm_90a) form of
#       mma_gemm; staged: scratch for x in the MMA's operand order (csrc/kernels.h says its size)
#   embedding_q8_0(table, ids, ids_int64, out, t, v, h, stream)
#   mma_dequantize(args: MmaArgs, out, stream)   the weight of mma_gemm's argument block dequantized to bf16:
#       out[n * args.ldy + k] = W[n, k] · args.row_scale[n] (every format; the bits of the Triton pass, mma_dequant,
#       and of the checkpoint dequantization)
#   mma_blocks_per_sm(format_id, mt, rt, tiles=8): CTAs of the tensor-core GEMM one SM of the current device holds
#   mma_smem_bytes(format_id, mt, tiles=8, resident_rows=0, chunks_per_split=0): the dynamic shared memory one CTA of
#       that kernel takes (held rows where resident_rows > 0; 0: no such kernel), computed on the host
#   wgmma_blocks_per_sm(format_id, mt): the same for wgmma_gemm (0 off sm_90)
#   block_scaled_mma_probe(kind, a, b, c, sfa, sfb, d, fragments, byte_id_a, thread_id_a, byte_id_b, thread_id_b,
#       stream): SM12x's block-scaled mma.sync (kind: block_scaled_mma.kind_id) once per warp for each fragment of
#       lane registers, a uint32 [fragments, 32, 4], b [.., 2], c and d float32 [.., 4], sfa and sfb uint32
#       [fragments, 32]: the instruction on sm_120a / sm_121a, its emulation (block_scaled_mma's model) elsewhere
#   bsmma_gemm(args: BsmmaArgs, x, xq, xs, bias, y, m, stream): SM12x's block-scaled mma.sync GEMM (the instruction
#       on sm_120a / sm_121a, its exact model elsewhere): x quantized into the scratch xq / xs (bsmma_x_bytes(kind, m,
#       units, scales) bytes each), then y = row_scale · x̂ · W (+ bias), bf16
#   bsmma_x_bytes(kind, m, units, scales): those scratch sizes
#   bsmma_quantize(args, x, xq, xs, m, stream) and bsmma_mma(args, xq, xs, x_row_scale, table, blocks, bias, y, m,
#       stream): its two launches one at a time; bsmma_mma on quantized rows, y float32 where args.out_f32, grouped
#       over a block table (int32 [3, blocks], b12x_core.moe_blocks) where table is nonzero; FP8 (kind
#       interface.BSMMA_KIND_FP8) takes the fp8 pass's codes and per-row scale
#   sm90_mixed_gemm(weight, reordered, m, n, k, w, scales, x, y, alpha, bias, decomposition, sms, workspace,
#       workspace_bytes, stream, tokens=128): the Hopper mixed-input GEMM on CUTLASS's SM90 pieces (sm_90a;
#       csrc/sm90_mixed.h): y[m, n] = (x . W^T) * alpha[n] + bias[n], weight an interface.SM90_MIXED_WEIGHTS id, W in
#       the layout sm90_mixed_reorder writes (reordered) or the checkpoint's K-major rows, tokens the tile's
#       (interface.SM90_MIXED.token_tiles)
#   sm90_mixed_workspace_bytes(weight, reordered, m, n, k, decomposition, sms, tokens=128): the scheduler's scratch
#       for that shape and tile
#   sm90_mixed_reorder(weight, src, dst, n, k, stream): logical codes [n, k] -> the layout the kernel reads
#   sm90_mixed_built(): whether this build holds those kernels (it targets sm_90)
#   sm90_moe_gemm(weight, experts, n, k, w, scales, x, y, y_float, offsets, sms, workspace, workspace_bytes, stream):
#       its grouped form for the fused MoE (csrc/sm90_moe.h): y[r] = x[r] . W[e]^T for the rows r of expert e, y
#       float32 (y_float) or bf16, offsets int32 [E + 1] on the device, W [E, n, k] e2m1 in the checkpoint's layout,
#       scales [E, k / 64, n] carriers
#   sm90_moe_workspace_bytes(weight, experts, n, k, y_float, sms): the workspace a call takes (problem table, TMA
#       descriptors)
gemv_ggml = _C.gemv_ggml if _C else _needs_build("gemv_ggml")
gemv_elem = _C.gemv_elem if _C else _needs_build("gemv_elem")
mma_gemm = _C.mma_gemm if _C else _needs_build("mma_gemm")
wgmma_gemm = _C.wgmma_gemm if _C else _needs_build("wgmma_gemm")
wgmma_blocks_per_sm = _C.wgmma_blocks_per_sm if _C else _needs_build("wgmma_blocks_per_sm")
embedding_q8_0 = _C.embedding_q8_0 if _C else _needs_build("embedding_q8_0")
mma_dequantize = _C.mma_dequantize if _C else _needs_build("mma_dequantize")
mma_blocks_per_sm = _C.mma_blocks_per_sm if _C else _needs_build("mma_blocks_per_sm")
mma_smem_bytes = _C.mma_smem_bytes if _C else _needs_build("mma_smem_bytes")
block_scaled_mma_probe = _C.block_scaled_mma_probe if _C else _needs_build("block_scaled_mma_probe")
bsmma_gemm = _C.bsmma_gemm if _C else _needs_build("bsmma_gemm")
bsmma_x_bytes = _C.bsmma_x_bytes if _C else _needs_build("bsmma_x_bytes")
bsmma_quantize = _C.bsmma_quantize if _C else _needs_build("bsmma_quantize")
bsmma_mma = _C.bsmma_mma if _C else _needs_build("bsmma_mma")
sm90_mixed_gemm = _C.sm90_mixed_gemm if _C else _needs_build("sm90_mixed_gemm")
sm90_mixed_workspace_bytes = _C.sm90_mixed_workspace_bytes if _C else _needs_build("sm90_mixed_workspace_bytes")
sm90_mixed_reorder = _C.sm90_mixed_reorder if _C else _needs_build("sm90_mixed_reorder")
sm90_mixed_built = _C.sm90_mixed_built if _C else (lambda: False)
sm90_moe_gemm = _C.sm90_moe_gemm if _C else _needs_build("sm90_moe_gemm")
fragment_mma_gemm = _C.fragment_mma_gemm if _C else _needs_build("fragment_mma_gemm")
fragment_mma_partial_floats = _C.fragment_mma_partial_floats if _C else _needs_build("fragment_mma_partial_floats")
fragment_mma_tickets = _C.fragment_mma_tickets if _C else _needs_build("fragment_mma_tickets")
sm90_moe_workspace_bytes = _C.sm90_moe_workspace_bytes if _C else _needs_build("sm90_moe_workspace_bytes")
