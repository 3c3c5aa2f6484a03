// The tensor-core GEMM's kernels for FmtFP8, FmtFP8Block (one translation unit per format family, so the
// build compiles them in parallel). The kernel itself is in mma_gemm.cuh.
#include "mma_gemm.cuh"

namespace b12x {
namespace mma {
B12X_MMA_KERNELS(, FmtFP8)
B12X_MMA_KERNELS(, FmtFP8Block)
}  // namespace mma
}  // namespace b12x
