// Decode (small-M) GEMV for raw GGML blocks (Q8_0, IQ2_XXS, IQ2_XS) with bf16 activations.
//
// One warp per output row, 256 weights per warp step (one group of 8 per lane), decoded in registers and
// multiplied into all M (<= MAXM) activation rows at once, so each weight byte is read once per call
// whatever M is. IQ2 lookups go to shared-memory tables (every lane indexes a different entry, which the
// constant cache would serialise). Summation: fp32 per group, per lane, then a warp butterfly.
#include "common.cuh"
#include "kernels.h"

namespace b12x {
namespace {

constexpr int kWarpsPerBlock = 8;

// IQ2 tables in shared memory, built once per thread block from the grid b12x_core uploads:
//   mag[e][j]  the grid magnitudes as floats (no per-weight integer->float conversion), and
//   sign[s][p] for each 8-bit sign pattern, XOR masks that flip the signs of bf16 activation pairs p = 0..3
//              (bits 15 and 31), so a sign costs a quarter of an XOR per weight instead of a select.
// The block scale db multiplies each group's sum once.
template <int kEntries>
struct Iq2Tables {
  float4 mag[kEntries][2];
  uint4 sign[256];
};

template <int kEntries>
__device__ void build_iq2_tables(Iq2Tables<kEntries>& t, const uint64_t* grid) {
  for (int i = threadIdx.x; i < kEntries * 8; i += blockDim.x) {
    reinterpret_cast<float*>(t.mag)[i] = float((grid[i / 8] >> (8 * (i % 8))) & 0xff);
  }
  for (int s = threadIdx.x; s < 256; s += blockDim.x) {
    uint32_t m[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) m[p] = ((s >> (2 * p)) & 1u) << 15 | ((s >> (2 * p + 1)) & 1u) << 31;
    t.sign[s] = make_uint4(m[0], m[1], m[2], m[3]);
  }
}

// sum_j mag[e][j] * sign_j * x_j for one group of 8, x given as 4 packed bf16 pairs.
template <int kEntries>
__device__ __forceinline__ float iq2_dot8(const Iq2Tables<kEntries>& t, int entry, uint32_t sign7, uint4 x) {
  const uint32_t signs = sign7 | ((__popc(sign7) & 1u) << 7);  // the 8th sign keeps negatives even
  const uint4 mask = t.sign[signs];
  const float4 lo = t.mag[entry][0], hi = t.mag[entry][1];
  const uint32_t p0 = x.x ^ mask.x, p1 = x.y ^ mask.y, p2 = x.z ^ mask.z, p3 = x.w ^ mask.w;
  // bf16 -> fp32 is a 16-bit shift: low half up, high half masked
  float s = lo.x * __uint_as_float(p0 << 16);
  s = fmaf(lo.y, __uint_as_float(p0 & 0xffff0000u), s);
  s = fmaf(lo.z, __uint_as_float(p1 << 16), s);
  s = fmaf(lo.w, __uint_as_float(p1 & 0xffff0000u), s);
  s = fmaf(hi.x, __uint_as_float(p2 << 16), s);
  s = fmaf(hi.y, __uint_as_float(p2 & 0xffff0000u), s);
  s = fmaf(hi.z, __uint_as_float(p3 << 16), s);
  s = fmaf(hi.w, __uint_as_float(p3 & 0xffff0000u), s);
  return s;
}

struct Q8_0 {
  static constexpr int kGroup = 32, kBytes = 34;
  struct Shared {};
  __device__ static void prepare(Shared&, const uint64_t*) {}
  struct Group {
    float d;
    uint32_t q[2];  // 8 int8 weights
  };
  __device__ static Group load(const uint8_t* blk, int g, const Shared&) {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(blk + 2 + 8 * g);
    return {load_half_a2(blk), {uint32_t(q[0]) | uint32_t(q[1]) << 16, uint32_t(q[2]) | uint32_t(q[3]) << 16}};
  }
  __device__ static float dot(const Group& w, uint4 x, const Shared&) {
    float xv[8];
    load_x8(reinterpret_cast<const __nv_bfloat16*>(&x), xv);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) s = fmaf(float(int8_t(w.q[j / 4] >> (8 * (j % 4)))), xv[j], s);
    return w.d * s;
  }
};

struct IQ2_XXS {
  static constexpr int kGroup = 256, kBytes = 66;
  using Shared = Iq2Tables<256>;
  __device__ static void prepare(Shared& t, const uint64_t* grid) { build_iq2_tables(t, grid); }
  struct Group {
    float db;
    int entry;
    uint32_t sign7;
  };
  __device__ static Group load(const uint8_t* blk, int g, const Shared&) {
    const int ib = g >> 2, l = g & 3;
    const uint32_t aux0 = load_u32_a2(blk + 2 + 8 * ib);
    const uint32_t aux1 = load_u32_a2(blk + 6 + 8 * ib);
    const float db = load_half_a2(blk) * (0.5f + float(aux1 >> 28)) * 0.25f;
    return {db, int((aux0 >> (8 * l)) & 0xff), (aux1 >> (7 * l)) & 127u};
  }
  __device__ static float dot(const Group& w, uint4 x, const Shared& t) {
    return w.db * iq2_dot8(t, w.entry, w.sign7, x);
  }
};

struct IQ2_XS {
  static constexpr int kGroup = 256, kBytes = 74;
  using Shared = Iq2Tables<512>;
  __device__ static void prepare(Shared& t, const uint64_t* grid) { build_iq2_tables(t, grid); }
  using Group = IQ2_XXS::Group;
  __device__ static Group load(const uint8_t* blk, int g, const Shared&) {
    const uint32_t q = reinterpret_cast<const uint16_t*>(blk + 2)[g];
    const uint32_t sc = blk[66 + (g >> 2)];
    const uint32_t nibble = (g & 3) < 2 ? (sc & 15u) : (sc >> 4);
    return {load_half_a2(blk) * (0.5f + float(nibble)) * 0.25f, int(q & 511u), q >> 9};
  }
  __device__ static float dot(const Group& w, uint4 x, const Shared& t) {
    return w.db * iq2_dot8(t, w.entry, w.sign7, x);
  }
};

// A warp step covers 256 consecutive weights of its row: lane l takes group l (weights 8l..8l+7), so the
// lanes read consecutive activation bytes (16 B each, coalesced) and neighbouring block bytes. For IQ2 that
// is one block per step; for Q8_0, eight. Each weight group is loaded and decoded once and multiplied into
// all M (<= MAXM) activation rows.
template <class Codec, int MAXM>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    gemv_kernel(const uint8_t* __restrict__ w, const uint64_t* __restrict__ grid,
                const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ bias,
                __nv_bfloat16* __restrict__ y, int M, int N, int K) {
  __shared__ typename Codec::Shared tables;
  Codec::prepare(tables, grid);
  __syncthreads();

  constexpr int kGroupsPerBlock = Codec::kGroup / 8;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const uint8_t* w_row = w + size_t(row) * (K / Codec::kGroup) * Codec::kBytes;

  float acc[MAXM];
#pragma unroll
  for (int m = 0; m < MAXM; ++m) acc[m] = 0.f;

#pragma unroll 2
  for (int k = 8 * lane; k < K; k += 256) {
    const int group = k / 8;
    const auto wg = Codec::load(w_row + size_t(group / kGroupsPerBlock) * Codec::kBytes, group % kGroupsPerBlock,
                                tables);
#pragma unroll
    for (int m = 0; m < MAXM; ++m) {
      if (m < M) {
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + size_t(m) * K + k));
        acc[m] += Codec::dot(wg, xv, tables);
      }
    }
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
