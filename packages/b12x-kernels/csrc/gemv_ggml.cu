// Decode (small-M) GEMV for raw GGML blocks (Q8_0, IQ2_XXS, IQ2_XS) with bf16 activations.
//
// One warp per output row, 256 weights per warp step (one group of 8 per lane), decoded in registers and
// multiplied into all M (<= MAXM) activation rows at once, so each weight byte is read once per call
// whatever M is. The IQ2 grid (2 or 4 KB) is staged into shared memory: every lane indexes it at a
// different entry, which the constant cache would serialise. The 8th sign bit is rebuilt from the parity of
// the 7 stored ones instead of a table lookup. Summation: fp32 per lane, then a warp butterfly.
#include "common.cuh"
#include "kernels.h"
#include "launch.cuh"

namespace b12x {
namespace {

constexpr int kWarpsPerBlock = 8;

// Each codec decodes one group of 8 weights: group g (0 <= g < kGroup/8) of the block at `blk`.
struct Q8_0 {
  static constexpr int kGroup = Q8_0_GROUP, kBytes = Q8_0_BYTES, kGridEntries = 0;
  __device__ static void decode(const uint8_t* blk, int g, const uint64_t*, float w[8]) {
    const float d = load_half_a2(blk);
    const uint8_t* q = blk + Q8_0_QS_OFFSET + 8 * g;
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      const uint16_t pair = *reinterpret_cast<const uint16_t*>(q + j);
      w[j] = d * float(int8_t(pair & 0xff));
      w[j + 1] = d * float(int8_t(pair >> 8));
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
  static constexpr int kGroup = IQ2_XXS_GROUP, kBytes = IQ2_XXS_BYTES, kGridEntries = IQ2_XXS_GRID_ENTRIES;
  __device__ static void decode(const uint8_t* blk, int g, const uint64_t* grid, float w[8]) {
    const int ib = g >> 2, l = g & 3;
    const uint32_t aux0 = load_u32_a2(blk + IQ2_XXS_QS_OFFSET + 8 * ib);      // 4 grid bytes
    const uint32_t aux1 = load_u32_a2(blk + IQ2_XXS_QS_OFFSET + 4 + 8 * ib);  // 4 × 7 sign bits, 4-bit scale
    const float db = load_half_a2(blk) * (0.5f + float(aux1 >> 28)) * 0.25f;
    iq2_group(grid[(aux0 >> (8 * l)) & 0xff], (aux1 >> (7 * l)) & 127u, db, w);
  }
};

struct IQ2_XS {
  static constexpr int kGroup = IQ2_XS_GROUP, kBytes = IQ2_XS_BYTES, kGridEntries = IQ2_XS_GRID_ENTRIES;
  __device__ static void decode(const uint8_t* blk, int g, const uint64_t* grid, float w[8]) {
    const uint32_t q = reinterpret_cast<const uint16_t*>(blk + IQ2_XS_QS_OFFSET)[g];
    const uint32_t sc = blk[IQ2_XS_SCALES_OFFSET + (g >> 2)];
    const uint32_t nibble = (g & 3) < 2 ? (sc & 15u) : (sc >> 4);
    const float db = load_half_a2(blk) * (0.5f + float(nibble)) * 0.25f;
    iq2_group(grid[q & 511u], q >> 9, db, w);
  }
};

// A warp step covers 256 consecutive weights of its row: lane l decodes group l (weights 8l..8l+7), so the
// lanes read consecutive activation bytes (16 B each, coalesced) and neighbouring block bytes. For IQ2 that
// is one block per step; for Q8_0, eight.
template <class Codec, int MAXM>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    gemv_kernel(const uint8_t* __restrict__ w, const uint64_t* __restrict__ grid_global,
                const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ bias,
                __nv_bfloat16* __restrict__ y, int M, int N, int K) {
  __shared__ uint64_t grid[Codec::kGridEntries > 0 ? Codec::kGridEntries : 1];
  for (int i = threadIdx.x; i < Codec::kGridEntries; i += blockDim.x) grid[i] = grid_global[i];
  __syncthreads();

  constexpr int kGroupsPerBlock = Codec::kGroup / 8;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  const uint8_t* w_row = w + size_t(row) * (K / Codec::kGroup) * Codec::kBytes;
  // Before the previous kernel ends (launch.cuh): the start of the row's blocks toward L2, a line a lane.
  if (row < N && lane * 128 < (K / Codec::kGroup) * Codec::kBytes) prefetch_l2(w_row + lane * 128);
  grid_dependency_wait();
  if (row >= N) return;

  float acc[MAXM];
#pragma unroll
  for (int m = 0; m < MAXM; ++m) acc[m] = 0.f;

  for (int k = 8 * lane; k < K; k += 256) {
    const int group = k / 8;
    float wv[8];
    Codec::decode(w_row + size_t(group / kGroupsPerBlock) * Codec::kBytes, group % kGroupsPerBlock, grid, wv);
#pragma unroll
    for (int m = 0; m < MAXM; ++m) {
      if (m < M) {
        float xv[8];
        load_x8(x + size_t(m) * K + k, xv);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[m] = fmaf(wv[j], xv[j], acc[m]);
      }
    }
  }
  grid_dependents_launch();
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
cudaError_t launch(const GemvGgmlArgs& p, const __nv_bfloat16* x, const __nv_bfloat16* bias, __nv_bfloat16* y,
                   int M, cudaStream_t stream) {
  const dim3 block(32 * kWarpsPerBlock), blocks((p.N + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return with_bucket(p.max_m, [&](auto bucket) {
    return launch_kernel(p.pdl, gemv_kernel<Codec, decltype(bucket)::value>, blocks, block, 0, stream, p.w, p.grid, x,
                         bias, y, M, p.N, p.K);
  });
}

}  // namespace

cudaError_t gemv_ggml(const GemvGgmlArgs& p, const __nv_bfloat16* x, const __nv_bfloat16* bias, __nv_bfloat16* y,
                      int M, cudaStream_t stream) {
  switch (p.format) {
    case FMT_Q8_0: return launch<Q8_0>(p, x, bias, y, M, stream);
    case FMT_IQ2_XXS: return launch<IQ2_XXS>(p, x, bias, y, M, stream);
    case FMT_IQ2_XS: return launch<IQ2_XS>(p, x, bias, y, M, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace b12x
