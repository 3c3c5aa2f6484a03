// Decode (small-M) GEMV for raw GGML blocks (Q8_0, IQ2_XXS, IQ2_XS) with bf16 activations.
//
// One warp per output row; lane l takes the row's blocks l, l+32, ... and decodes each group of 8 weights in
// registers, multiplying it into all M (<= MAXM) activation rows at once, so each weight byte is read once
// per call whatever M is. The IQ2 grid (2 or 4 KB) is staged into shared memory: every lane indexes it at a
// different entry, which the constant cache would serialise. The 8th sign bit is rebuilt from the parity of
// the 7 stored ones instead of a table lookup. Summation: fp32 per lane, then a warp butterfly.
#include "common.cuh"
#include "kernels.h"

namespace b12x {
namespace {

constexpr int kWarpsPerBlock = 8;

struct Q8_0 {
  static constexpr int kGroup = 32, kBytes = 34, kGridEntries = 0;
  template <class F>
  __device__ static void decode(const uint8_t* blk, const uint64_t*, F&& use) {
    const float d = load_half_a2(blk);
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      float w[8];
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        const uint16_t pair = *reinterpret_cast<const uint16_t*>(blk + 2 + 8 * g + j);
        w[j] = d * float(int8_t(pair & 0xff));
        w[j + 1] = d * float(int8_t(pair >> 8));
      }
      use(g, w);
    }
  }
};

__device__ __forceinline__ void iq2_group(uint64_t grid_entry, uint32_t sign7, float db, float w[8]) {
  const uint32_t signs = sign7 | ((__popc(sign7) & 1u) << 7);  // even number of negatives
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float mag = float((grid_entry >> (8 * j)) & 0xff);
    w[j] = (signs >> j & 1u) ? -(db * mag) : db * mag;  // llama.cpp: db * grid * (+-1)
  }
}

struct IQ2_XXS {
  static constexpr int kGroup = 256, kBytes = 66, kGridEntries = 256;
  template <class F>
  __device__ static void decode(const uint8_t* blk, const uint64_t* grid, F&& use) {
    const float d = load_half_a2(blk);
#pragma unroll 2
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t aux0 = load_u32_a2(blk + 2 + 8 * ib);
      const uint32_t aux1 = load_u32_a2(blk + 6 + 8 * ib);
      const float db = d * (0.5f + float(aux1 >> 28)) * 0.25f;
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        float w[8];
        iq2_group(grid[(aux0 >> (8 * l)) & 0xff], (aux1 >> (7 * l)) & 127u, db, w);
        use(4 * ib + l, w);
      }
    }
  }
};

struct IQ2_XS {
  static constexpr int kGroup = 256, kBytes = 74, kGridEntries = 512;
  template <class F>
  __device__ static void decode(const uint8_t* blk, const uint64_t* grid, F&& use) {
    const float d = load_half_a2(blk);
    const uint16_t* qs = reinterpret_cast<const uint16_t*>(blk + 2);
#pragma unroll 2
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t sc = blk[66 + ib];
      const float db_lo = d * (0.5f + float(sc & 15u)) * 0.25f;
      const float db_hi = d * (0.5f + float(sc >> 4)) * 0.25f;
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const uint32_t q = qs[4 * ib + l];
        float w[8];
        iq2_group(grid[q & 511u], q >> 9, l < 2 ? db_lo : db_hi, w);
        use(4 * ib + l, w);
      }
    }
  }
};

template <class Codec, int MAXM>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    gemv_kernel(const uint8_t* __restrict__ w, const uint64_t* __restrict__ grid_global,
                const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ bias,
                __nv_bfloat16* __restrict__ y, int M, int N, int K) {
  __shared__ uint64_t grid[Codec::kGridEntries > 0 ? Codec::kGridEntries : 1];
  for (int i = threadIdx.x; i < Codec::kGridEntries; i += blockDim.x) grid[i] = grid_global[i];
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const int blocks = K / Codec::kGroup;
  const uint8_t* w_row = w + size_t(row) * blocks * Codec::kBytes;

  float acc[MAXM];
#pragma unroll
  for (int m = 0; m < MAXM; ++m) acc[m] = 0.f;

  for (int b = lane; b < blocks; b += 32) {
    const int k0 = b * Codec::kGroup;
    Codec::decode(w_row + size_t(b) * Codec::kBytes, grid, [&](int g, const float wv[8]) {
#pragma unroll
      for (int m = 0; m < MAXM; ++m) {
        if (m < M) {
          float xv[8];
          load_x8(x + size_t(m) * K + k0 + 8 * g, xv);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[m] = fmaf(wv[j], xv[j], acc[m]);
        }
      }
    });
  }
#pragma unroll
  for (int m = 0; m < MAXM; ++m) {
    if (m < M) {
      const float total = warp_sum(acc[m]);
      if (lane == 0) {
        const float b = bias ? __bfloat162float(bias[row]) : 0.f;
        y[size_t(m) * N + row] = __float2bfloat16(total + b);
      }
    }
  }
}

template <class Codec>
cudaError_t launch(const uint8_t* w, const uint64_t* grid, const __nv_bfloat16* x, const __nv_bfloat16* bias,
                   __nv_bfloat16* y, int M, int N, int K, cudaStream_t stream) {
  const dim3 block(32 * kWarpsPerBlock), blocks((N + kWarpsPerBlock - 1) / kWarpsPerBlock);
  // MAXM buckets keep register use (one fp32 accumulator per token) proportional to M.
  if (M <= 1) gemv_kernel<Codec, 1><<<blocks, block, 0, stream>>>(w, grid, x, bias, y, M, N, K);
  else if (M <= 2) gemv_kernel<Codec, 2><<<blocks, block, 0, stream>>>(w, grid, x, bias, y, M, N, K);
  else if (M <= 4) gemv_kernel<Codec, 4><<<blocks, block, 0, stream>>>(w, grid, x, bias, y, M, N, K);
  else if (M <= 8) gemv_kernel<Codec, 8><<<blocks, block, 0, stream>>>(w, grid, x, bias, y, M, N, K);
  else gemv_kernel<Codec, 16><<<blocks, block, 0, stream>>>(w, grid, x, bias, y, M, N, K);
  return cudaGetLastError();
}

}  // namespace

cudaError_t gemv_ggml(int format, const uint8_t* w, const uint64_t* grid, const __nv_bfloat16* x,
                      const __nv_bfloat16* bias, __nv_bfloat16* y, int M, int N, int K, cudaStream_t stream) {
  switch (format) {
    case kQ8_0: return launch<Q8_0>(w, grid, x, bias, y, M, N, K, stream);
    case kIQ2_XXS: return launch<IQ2_XXS>(w, grid, x, bias, y, M, N, K, stream);
    case kIQ2_XS: return launch<IQ2_XS>(w, grid, x, bias, y, M, N, K, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace b12x
