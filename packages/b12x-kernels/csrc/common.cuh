// Shared device helpers: bf16 conversion and unaligned little-endian loads from packed GGML blocks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace b12x {

// GGML block lengths (format_facts.h: *_BYTES) are even but no multiple of 4, so only 2-byte alignment is
// guaranteed: read wider fields in u16 halves.
__device__ __forceinline__ uint32_t load_u32_a2(const uint8_t* p) {
  const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
  return uint32_t(q[0]) | (uint32_t(q[1]) << 16);
}

__device__ __forceinline__ float load_half_a2(const uint8_t* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}

// 8 bf16 activations (one 16-byte load) -> float.
__device__ __forceinline__ void load_x8(const __nv_bfloat16* x, float out[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(x);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// fn(std::integral_constant<int, B>{}) for the GEMVs' accumulator bucket B = max_m (1, 2, 4, 8 or 16: the caller's
// plan picks it, so register use, one fp32 accumulator per token, follows M): fn's launch error.
template <class Fn>
cudaError_t with_bucket(int max_m, Fn&& fn) {
  switch (max_m) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 8: return fn(std::integral_constant<int, 8>{});
    case 16: return fn(std::integral_constant<int, 16>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace b12x
