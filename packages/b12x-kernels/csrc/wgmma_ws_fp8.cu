// The warp-specialized Hopper GEMM's kernels for FmtFP8, FmtMXFP8 (one translation unit per format family, so the build
// compiles them in parallel). The kernel itself is in wgmma_ws_gemm.cuh.
#include "wgmma_ws_gemm.cuh"

namespace b12x {
namespace wgmma_ws {
B12X_WGMMA_WS_LAUNCHES(, FmtFP8)
B12X_WGMMA_WS_LAUNCHES(, FmtMXFP8)
}  // namespace wgmma_ws
}  // namespace b12x
