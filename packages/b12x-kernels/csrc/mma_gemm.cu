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

namespace {
// fn(F{}) for the decode functor F of a format number (FMT_*), or `fallback` for an unknown number.
template <class R, class Fn>
R with_format(int format, R fallback, Fn&& fn) {
  switch (format) {
    case FMT_FP8: return fn(FmtFP8{});
    case FMT_FP8_BLOCK: return fn(FmtFP8Block{});
    case FMT_MXFP8: return fn(FmtMXFP8{});
    case FMT_NVFP4: return fn(FmtFP4<true>{});
    case FMT_MXFP4: return fn(FmtFP4<false>{});
    case FMT_Q8_0: return fn(FmtQ8_0{});
    case FMT_IQ2_XXS: return fn(FmtIQ2<false>{});
    case FMT_IQ2_XS: return fn(FmtIQ2<true>{});
    default: return fallback;
  }
}
}  // namespace

int mma_blocks_per_sm(int format, int mt, int rt) {
  if ((mt != 1 && mt != 2 && mt != 4) || (rt != 1 && rt != 2)) return 0;
  return with_format(format, 0, [&](auto f) { return blocks_per_sm_cfg<decltype(f)>(mt, rt); });
}

int mma_chunk_k(int format) {
  return with_format(format, 0, [](auto f) { return decltype(f)::KB; });
}

cudaError_t mma_gemm(const MmaArgs& a, cudaStream_t stream) {
  MmaParams p{};
  static_cast<MmaArgs&>(p) = a;
  p.n16 = (a.N + 15) / 16;
  p.chunks_per_split = (a.chunks + a.splits - 1) / a.splits;
  const int nblocks = (p.n16 + kWarps - 1) / kWarps;  // kWarps row tiles (128 rows) per CTA
  return with_format(a.format, cudaErrorInvalidValue,
                     [&](auto f) { return launch_cfg<decltype(f)>(a.mt, a.rt, p, nblocks, stream); });
}

}  // namespace b12x
