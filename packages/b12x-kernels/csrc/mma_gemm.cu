// Host entry points of the tensor-core GEMM (kernels.h): argument packing and the format switch. The kernels are
// instantiated in mma_gemm_<format>.cu.
#include "mma_gemm.cuh"

namespace b12x {
namespace mma {
extern template cudaError_t launch_cfg<FmtFP8>(int, int, const MmaParams&, int, cudaStream_t);
extern template int blocks_per_sm_cfg<FmtFP8>(int, int);
extern template cudaError_t launch_cfg<FmtFP8Block>(int, int, const MmaParams&, int, cudaStream_t);
extern template int blocks_per_sm_cfg<FmtFP8Block>(int, int);
extern template cudaError_t launch_cfg<FmtMXFP8>(int, int, const MmaParams&, int, cudaStream_t);
extern template int blocks_per_sm_cfg<FmtMXFP8>(int, int);
extern template cudaError_t launch_cfg<FmtFP4<true>>(int, int, const MmaParams&, int, cudaStream_t);
extern template int blocks_per_sm_cfg<FmtFP4<true>>(int, int);
extern template cudaError_t launch_cfg<FmtFP4<false>>(int, int, const MmaParams&, int, cudaStream_t);
extern template int blocks_per_sm_cfg<FmtFP4<false>>(int, int);
extern template cudaError_t launch_cfg<FmtQ8_0>(int, int, const MmaParams&, int, cudaStream_t);
extern template int blocks_per_sm_cfg<FmtQ8_0>(int, int);
extern template cudaError_t launch_cfg<FmtIQ2<false>>(int, int, const MmaParams&, int, cudaStream_t);
extern template int blocks_per_sm_cfg<FmtIQ2<false>>(int, int);
extern template cudaError_t launch_cfg<FmtIQ2<true>>(int, int, const MmaParams&, int, cudaStream_t);
extern template int blocks_per_sm_cfg<FmtIQ2<true>>(int, int);
}  // namespace mma

using namespace mma;

int mma_blocks_per_sm(int format, int mt, int rt) {
  if ((mt != 1 && mt != 2 && mt != 4) || (rt != 1 && rt != 2)) return 0;
  switch (format) {
    case FMT_FP8: return blocks_per_sm_cfg<FmtFP8>(mt, rt);
    case FMT_FP8_BLOCK: return blocks_per_sm_cfg<FmtFP8Block>(mt, rt);
    case FMT_MXFP8: return blocks_per_sm_cfg<FmtMXFP8>(mt, rt);
    case FMT_NVFP4: return blocks_per_sm_cfg<FmtFP4<true>>(mt, rt);
    case FMT_MXFP4: return blocks_per_sm_cfg<FmtFP4<false>>(mt, rt);
    case FMT_Q8_0: return blocks_per_sm_cfg<FmtQ8_0>(mt, rt);
    case FMT_IQ2_XXS: return blocks_per_sm_cfg<FmtIQ2<false>>(mt, rt);
    case FMT_IQ2_XS: return blocks_per_sm_cfg<FmtIQ2<true>>(mt, rt);
    default: return 0;
  }
}

int mma_chunk_k(int format) {
  switch (format) {
    case FMT_FP8: case FMT_FP8_BLOCK: case FMT_MXFP8: case FMT_Q8_0: return 64;
    case FMT_NVFP4: case FMT_MXFP4: return 128;
    case FMT_IQ2_XXS: case FMT_IQ2_XS: return 256;
    default: return 0;
  }
}

cudaError_t mma_gemm(const MmaArgs& a, cudaStream_t stream) {
  MmaParams p{};
  p.codes = reinterpret_cast<const uint4*>(a.codes);
  p.meta = a.meta;
  p.meta2 = a.meta2;
  p.block_scale = a.block_scale;
  p.tables = a.tables;
  p.alpha = a.alpha;
  p.scale_mul = a.scale_mul;
  p.x = a.x;
  p.bias = a.bias;
  p.y = a.y;
  p.ldy = a.ldy;
  p.M = a.M;
  p.N = a.N;
  p.K = a.K;
  p.n16 = (a.N + 15) / 16;
  p.chunks = a.chunks;
  p.splits = a.splits;
  p.chunks_per_split = (a.chunks + a.splits - 1) / a.splits;
  p.partials = a.partials;
  p.tickets = a.tickets;
  const int nblocks = (p.n16 + 7) / 8;  // 128 rows per CTA
  switch (a.format) {
    case FMT_FP8: return launch_cfg<FmtFP8>(a.mt, a.rt, p, nblocks, stream);
    case FMT_FP8_BLOCK: return launch_cfg<FmtFP8Block>(a.mt, a.rt, p, nblocks, stream);
    case FMT_MXFP8: return launch_cfg<FmtMXFP8>(a.mt, a.rt, p, nblocks, stream);
    case FMT_NVFP4: return launch_cfg<FmtFP4<true>>(a.mt, a.rt, p, nblocks, stream);
    case FMT_MXFP4: return launch_cfg<FmtFP4<false>>(a.mt, a.rt, p, nblocks, stream);
    case FMT_Q8_0: return launch_cfg<FmtQ8_0>(a.mt, a.rt, p, nblocks, stream);
    case FMT_IQ2_XXS: return launch_cfg<FmtIQ2<false>>(a.mt, a.rt, p, nblocks, stream);
    case FMT_IQ2_XS: return launch_cfg<FmtIQ2<true>>(a.mt, a.rt, p, nblocks, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace b12x
