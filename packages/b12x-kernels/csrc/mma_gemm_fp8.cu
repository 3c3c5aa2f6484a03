// The tensor-core GEMM's kernels for FmtFP8, FmtFP8Block (one translation unit per format family, so the
// build compiles them in parallel). The kernel itself is in mma_gemm.cuh.
#include "mma_gemm.cuh"

namespace b12x {
namespace mma {
template cudaError_t launch_cfg<FmtFP8>(int, int, const MmaParams&, int, cudaStream_t);
template int blocks_per_sm_cfg<FmtFP8>(int, int);
template cudaError_t launch_cfg<FmtFP8Block>(int, int, const MmaParams&, int, cudaStream_t);
template int blocks_per_sm_cfg<FmtFP8Block>(int, int);
}  // namespace mma
}  // namespace b12x
