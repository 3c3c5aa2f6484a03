// The warp-specialized Hopper GEMM's dispatch (the kernel and its launch: wgmma_ws_gemm.cuh; their instantiations:
// wgmma_ws_fp4.cu, wgmma_ws_fp8.cu, wgmma_ws_q8_0.cu).
#include <cstdlib>

#include "wgmma_ws_gemm.cuh"

namespace b12x {
namespace wgmma_ws {
B12X_WGMMA_WS_LAUNCHES(extern, FmtFP8)
B12X_WGMMA_WS_LAUNCHES(extern, FmtMXFP8)
B12X_WGMMA_WS_LAUNCHES(extern, FmtFP4<true>)
B12X_WGMMA_WS_LAUNCHES(extern, FmtFP4<false>)
B12X_WGMMA_WS_LAUNCHES(extern, FmtQ8_0)

// fn(F{}, std::integral_constant<int, MT>{}) for the formats and token tiles this kernel runs, `fallback` for others.
template <class R, class Fn>
R with_config(int format, int mt, R fallback, Fn&& fn) {
  auto tiles = [&](auto f) -> R {
    switch (mt) {
      case 8: return fn(f, std::integral_constant<int, 8>{});
      case 16: return fn(f, std::integral_constant<int, 16>{});
      case 32: return fn(f, std::integral_constant<int, 32>{});
      default: return fallback;
    }
  };
  return with_wgmma_format(format, fallback, tiles);
}

}  // namespace wgmma_ws

bool wgmma_ws_token_tile(int format, int mt) {
  return wgmma_ws::with_config(format, mt, false, [](auto, auto) { return true; });
}

cudaError_t wgmma_ws_launch(const mma::MmaParams& p, uint8_t* staged, cudaStream_t stream) {
  using namespace wgmma_ws;
  // profiling only (wgmma_ws_gemm.cuh's `ablate`): a timing without one part of the kernel's work; wrong results
  const char* ablate_env = std::getenv("B12X_WS_ABLATE");
  const int ablate = ablate_env ? std::atoi(ablate_env) : 0;
  return with_config(p.format, p.mt, cudaErrorInvalidValue, [&](auto f, auto m) {
    return launch<decltype(f), decltype(m)::value>(p, staged, ablate, stream);
  });
}

}  // namespace b12x
