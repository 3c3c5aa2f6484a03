// Host entry points of the tensor-core GEMM (kernels.h): argument packing and the format switch. The kernels are
// instantiated in mma_gemm_<format>.cu.
#include "mma_gemm.cuh"

namespace b12x {
namespace mma {
B12X_MMA_KERNELS(extern, FmtFP8)
B12X_MMA_KERNELS(extern, FmtFP8Block)
B12X_MMA_KERNELS(extern, FmtMXFP8)
B12X_MMA_KERNELS(extern, FmtFP4<true>)
B12X_MMA_KERNELS(extern, FmtFP4<false>)
B12X_MMA_KERNELS(extern, FmtQ8_0)
B12X_MMA_KERNELS(extern, FmtIQ2<false>)
B12X_MMA_KERNELS(extern, FmtIQ2<true>)
}  // namespace mma

using namespace mma;

int mma_blocks_per_sm(int format, int mt, int rt, int tiles) {
  return with_format(format, 0, [&](auto f) { return blocks_per_sm_cfg<decltype(f)>(mt, rt, tiles); });
}

int mma_smem_bytes(int format, int mt, int tiles, int resident_rows, int chunks_per_split) {
  return with_format(format, 0, [&](auto f) {
    using F = decltype(f);
    return with_kernel(mt, 1, tiles, 0, [&](auto MT, auto, auto TL) {
      constexpr int mt_ = decltype(MT)::value, tl_ = decltype(TL)::value;
      if (resident_rows > 0) return mt_ == 1 ? resident_smem_bytes<F>(resident_rows, chunks_per_split, tl_) : 0;
      return smem_bytes<F, mt_, tl_>();
    });
  });
}

int mma_resident_smem_bytes(const MmaArgs& args, int M) {
  const int chunks_per_split = (args.chunks + args.splits - 1) / args.splits;
  return with_format(args.format, 0,
                     [&](auto f) { return resident_smem_bytes<decltype(f)>(M, chunks_per_split, args.tiles); });
}

const char* mma_args_error(const MmaArgs& p) {
  const int ck = with_format(p.format, 0, [](auto f) { return decltype(f)::KB; });
  if (!ck) return "mma_gemm: unknown format";
  if (p.N < 1 || p.K < 8 || p.K % 8) return "mma_gemm: need N >= 1 and K % 8 == 0";
  if (p.chunks * ck < p.K) return "mma_gemm: the repacked weight covers fewer than K columns";
  if (p.mt != 1 && p.mt != 2 && p.mt != 4) return "mma_gemm: mt must be 1, 2 or 4";
  if (p.rt != 1 && p.rt != 2) return "mma_gemm: rt must be 1 or 2";
  if (p.tiles != kWarps && !((p.tiles == 6 || p.tiles == 7) && p.mt == 1 && p.rt == 1))
    return "mma_gemm: tiles must be 8, or 6 or 7 at mt 1 and rt 1";
  if (p.resident != 0 && !(p.resident == 1 && p.mt == 1 && p.rt == 1))
    return "mma_gemm: resident activations need mt 1 and rt 1";
  if (p.x_quant != MMA_XQ_NONE) {  // activations quantized where the resident kernel holds them
    if (p.resident != 1)
      return "mma_gemm: x_quant (activations quantized in the kernel) needs resident activations";
    if (!with_format(p.format, false, [&](auto f) { return x_quantizes<decltype(f)>(p.x_quant); }))
      return "mma_gemm: x_quant names an activation mode this format's kernel does not quantize (fp8 static: FP8; "
             "mxfp8: MXFP8, MXFP4, NVFP4; nvfp4: NVFP4)";
    if (p.x_quant != MMA_XQ_MXFP8 && !(p.x_quant_scale > 0.f && p.x_quant_scale <= 3.402823466e38f))
      return "mma_gemm: x_quant's scale (fp8 static's divisor, nvfp4's global scale) must be positive and finite";
  }
  if (p.splits < 1 || p.splits > p.chunks) return "mma_gemm: splits must be in 1..chunks";
  if (p.epilogue < MMA_OUT_BF16 || p.epilogue > MMA_OUT_F32) return "mma_gemm: unknown epilogue";
  if (p.epilogue == MMA_OUT_SILU && p.N % 16) return "mma_gemm: silu needs N % 16 == 0 (8 gate, 8 up rows per tile)";
  if (!p.codes || reinterpret_cast<uintptr_t>(p.codes) % 16) return "mma_gemm: null or misaligned codes";
  return nullptr;
}

cudaError_t mma_gemm(const MmaArgs& args, const MmaCall& call, cudaStream_t stream) {
  MmaParams p{};
  static_cast<MmaArgs&>(p) = args;
  static_cast<MmaCall&>(p) = call;
  p.n16 = (args.N + 15) / 16;
  p.chunks_per_split = (args.chunks + args.splits - 1) / args.splits;
  if (call.order) {
    p.block_expert = call.table;
    p.block_start = call.table + call.blocks;
    p.block_rows = call.table + 2 * size_t(call.blocks);
  }
  const int nblocks = (p.n16 + args.tiles - 1) / args.tiles;  // `tiles` row tiles (16·tiles rows) per CTA
  return with_format(args.format, cudaErrorInvalidValue, [&](auto f) {
    return launch_cfg<decltype(f)>(args.mt, args.rt, args.tiles, p, nblocks, stream);
  });
}

}  // namespace b12x
