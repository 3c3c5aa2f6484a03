// static_for<N>(f): f(std::integral_constant<int, 0>{}) ... f(std::integral_constant<int, N - 1>{}), each index a
// constant expression, so register arrays indexed by it stay in registers and table reads fold. Plain C++ besides
// __device__ / __forceinline__, so a host test can include it (tests/kernels/block_scaled_host_warp.cpp).
#pragma once
#include <utility>

namespace b12x {

template <class Fn, int... I>
__device__ __forceinline__ void static_for_impl(Fn&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}

template <int N, class Fn>
__device__ __forceinline__ void static_for(Fn&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}

}  // namespace b12x
