// The tensor-core GEMM's kernels for FmtFP4<true>, FmtFP4<false> (one translation unit per format family, so the
// build compiles them in parallel). The kernel itself is in mma_gemm.cuh.
#include "mma_gemm.cuh"

namespace b12x {
namespace mma {
B12X_MMA_KERNELS(, FmtFP4<true>)
B12X_MMA_KERNELS(, FmtFP4<false>)
}  // namespace mma
}  // namespace b12x
