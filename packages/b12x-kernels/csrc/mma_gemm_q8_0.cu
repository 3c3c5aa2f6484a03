// The tensor-core GEMM's kernels for FmtQ8_0 (one translation unit per format family, so the
// build compiles them in parallel). The kernel itself is in mma_gemm.cuh.
#include "mma_gemm.cuh"

namespace b12x {
namespace mma {
B12X_MMA_KERNELS(, FmtQ8_0)
}  // namespace mma
}  // namespace b12x
