// Decode (small-M) GEMV for element formats with bf16 activations: FP8 (per tensor), FP8_BLOCK (128×128
// scales), MXFP8 and MXFP4 (E8M0 per 32), NVFP4 (E4M3 per 16 and a global scale).
//
// Same shape as gemv_ggml.cu: one warp per output row, a warp step covers 256 weights, lane l decodes group l
// (8 weights: 8 bytes of FP8 or 4 bytes of FP4) and multiplies it into every token; block scales multiply
// each group's 8-term sum once, the per-tensor scale the row's total.
#include <cuda_fp8.h>

#include "common.cuh"
#include "kernels.h"
#include "launch.cuh"

namespace b12x {
namespace {

constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ float e8m0(uint32_t b) {
  static_assert(E8M0_BIAS == 127, "E8M0 codes are float32 exponent bits");
  return b == 0 ? __int_as_float(0x00400000) : __int_as_float(int(b) << 23);  // 2^(b-127); b=0 is subnormal
}

__device__ __forceinline__ void e4m3x8(uint2 q, float w[8]) {
  const uint32_t words[2] = {q.x, q.y};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(words[h] >> (16 * p));
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      w[4 * h + 2 * p] = f.x;
      w[4 * h + 2 * p + 1] = f.y;
    }
  }
}

__device__ __forceinline__ void e2m1x8(uint32_t q, const float* table, float w[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j] = table[(q >> (4 * j)) & 15u];  // element 2i in the low nibble
}

// Group g of `row`: 8 weights (unscaled) and the block scale that multiplies their sum.
template <int kFormat>
__device__ __forceinline__ float load_group(const uint8_t* w, const uint8_t* scales, const float* e2m1, int row,
                                            int g, int N, int K, float out[8]) {
  const size_t k = size_t(g) * 8;
  if constexpr (kFormat == FMT_FP8 || kFormat == FMT_FP8_BLOCK || kFormat == FMT_MXFP8) {
    e4m3x8(*reinterpret_cast<const uint2*>(w + size_t(row) * K + k), out);
    if constexpr (kFormat == FMT_FP8) return 1.f;
    if constexpr (kFormat == FMT_FP8_BLOCK) {
      const int kb = (K + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE;
      return reinterpret_cast<const float*>(scales)[size_t(row / FP8_BLOCK_SIZE) * kb + k / FP8_BLOCK_SIZE];
    }
    return e8m0(scales[size_t(row) * (K / MX_GROUP) + k / MX_GROUP]);
  } else {
    e2m1x8(*reinterpret_cast<const uint32_t*>(w + size_t(row) * (K / 2) + k / 2), e2m1, out);
    if constexpr (kFormat == FMT_NVFP4) {
      const __nv_fp8_storage_t s = scales[size_t(row) * (K / NVFP4_GROUP) + k / NVFP4_GROUP];
      return __half2float(__half(__nv_cvt_fp8_to_halfraw(s, __NV_E4M3)));
    }
    return e8m0(scales[size_t(row) * (K / MX_GROUP) + k / MX_GROUP]);
  }
}

template <int kFormat, int MAXM>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    gemv_elem_kernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ scales, float tensor_scale,
                     const __nv_bfloat16* __restrict__ x, const float* __restrict__ x_scale, int x_scale_cols,
                     const __nv_bfloat16* __restrict__ bias, __nv_bfloat16* __restrict__ y, int ldy, int M, int N,
                     int K) {
  __shared__ float e2m1[16];
  if (threadIdx.x < 16) {
    const float mags[8] = {B12X_E2M1_VALUES};
    e2m1[threadIdx.x] = threadIdx.x < 8 ? mags[threadIdx.x] : -mags[threadIdx.x - 8];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  // Before the previous kernel ends (launch.cuh): the start of the row's weight bytes toward L2, a line a lane.
  constexpr int kRowBytes8 = (kFormat == FMT_NVFP4 || kFormat == FMT_MXFP4) ? 4 : 8;  // bytes per 8 weights
  if (row < N && lane * 128 < (K / 8) * kRowBytes8) prefetch_l2(w + size_t(row) * (K / 8) * kRowBytes8 + lane * 128);
  grid_dependency_wait();
  if (row >= N) return;

  float acc[MAXM];
#pragma unroll
  for (int m = 0; m < MAXM; ++m) acc[m] = 0.f;
  for (int g = lane; g < K / 8; g += 32) {
    float wv[8];
    const float block_scale = load_group<kFormat>(w, scales, e2m1, row, g, N, K, wv);
    // a group of 8 never straddles a 128-column activation group (128 is a multiple of 8)
    const int x_col = x_scale_cols > 1 ? (8 * g) / FP8_BLOCK_SIZE : 0;
#pragma unroll
    for (int m = 0; m < MAXM; ++m) {
      if (m < M) {
        float xv[8];
        load_x8(x + size_t(m) * K + 8 * g, xv);
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) s = fmaf(wv[j], xv[j], s);
        const float scale = x_scale ? block_scale * x_scale[size_t(m) * x_scale_cols + x_col] : block_scale;
        acc[m] = fmaf(scale, s, acc[m]);
      }
    }
  }
  grid_dependents_launch();
#pragma unroll
  for (int m = 0; m < MAXM; ++m) {
    if (m < M) {
      const float total = warp_sum(acc[m]) * tensor_scale;
      if (lane == 0) {
        const float b = bias ? __bfloat162float(bias[row]) : 0.f;
        y[size_t(m) * ldy + row] = __float2bfloat16(total + b);
      }
    }
  }
}

template <int kFormat>
cudaError_t launch(const GemvElemArgs& p, const __nv_bfloat16* x, const float* x_scale, const __nv_bfloat16* bias,
                   __nv_bfloat16* y, int M, cudaStream_t stream) {
  const dim3 block(32 * kWarpsPerBlock), grid((p.N + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return with_bucket(p.max_m, [&](auto bucket) {
    return launch_kernel(p.pdl, gemv_elem_kernel<kFormat, decltype(bucket)::value>, grid, block, 0, stream, p.w,
                         p.scales, p.tensor_scale, x, x_scale, p.x_scale_cols, bias, y, p.ldy, M, p.N, p.K);
  });
}

}  // namespace

cudaError_t gemv_elem(const GemvElemArgs& p, const __nv_bfloat16* x, const float* x_scale, const __nv_bfloat16* bias,
                      __nv_bfloat16* y, int M, cudaStream_t stream) {
  switch (p.format) {
    case FMT_FP8: return launch<FMT_FP8>(p, x, x_scale, bias, y, M, stream);
    case FMT_FP8_BLOCK: return launch<FMT_FP8_BLOCK>(p, x, x_scale, bias, y, M, stream);
    case FMT_MXFP8: return launch<FMT_MXFP8>(p, x, x_scale, bias, y, M, stream);
    case FMT_NVFP4: return launch<FMT_NVFP4>(p, x, x_scale, bias, y, M, stream);
    case FMT_MXFP4: return launch<FMT_MXFP4>(p, x, x_scale, bias, y, M, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace b12x
