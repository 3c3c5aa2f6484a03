// The tensor-core GEMM's kernels for FmtMXFP8 (one translation unit per format family, so the
// build compiles them in parallel). The kernel itself is in mma_gemm.cuh.
#include "mma_gemm.cuh"

namespace b12x {
namespace mma {
template cudaError_t launch_cfg<FmtMXFP8>(int, int, const MmaParams&, int, cudaStream_t);
template int blocks_per_sm_cfg<FmtMXFP8>(int, int);
}  // namespace mma
}  // namespace b12x
