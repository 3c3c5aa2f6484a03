// The block-scaled MMA probe: one instruction (block_scaled_mma.cuh) per warp for each of many fragments, the lanes'
// registers read from and D written to global memory, so a test can hold the device function (the instruction on
// sm_120a / sm_121a, its emulation on sm_90) to b12x_kernels.block_scaled_mma's model lane by lane.
#include "block_scaled_mma.cuh"
#include "kernels.h"
#include "launch.cuh"

namespace b12x {
namespace {

constexpr int PROBE_WARPS = 8;

// Selector combination C = ((byte-id-a · 2 + thread-id-a) · 4 + byte-id-b) · 4 + thread-id-b.
template <int C>
struct Selectors {
  static constexpr int ba = C / 32, ta = (C / 16) % 2, bb = (C / 4) % 4, tb = C % 4;
};

template <class I, int C>
__device__ __forceinline__ void call_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                         const float (&c)[4], uint32_t sfa, uint32_t sfb) {
  using S = Selectors<C>;
  if constexpr (bsmma::valid_selectors<I>(S::ba, S::ta, S::bb, S::tb)) {
    bsmma::mma<I, S::ba, S::ta, S::bb, S::tb>(d, a, b, c, sfa, sfb);
  }
}

// bsmma::mma<I, ...> for the combination's selectors (a warp-uniform choice among Table 40's: the instruction takes
// them as immediates). Off SM12x, where mma<I, ...> passes its selectors to bsmma::emulate<I>, the probe calls that
// with the values: one emulation in the kernel, not one per combination.
template <class I, int... C>
__device__ __forceinline__ void mma_of(int combination, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                       const float (&c)[4], uint32_t sfa, uint32_t sfb,
                                       std::integer_sequence<int, C...>) {
#ifdef B12X_BSMMA_NATIVE
  ((combination == C ? call_mma<I, C>(d, a, b, c, sfa, sfb) : void()), ...);
#else
  bsmma::emulate<I>(d, a, b, c, sfa, sfb, combination / 32, (combination / 16) % 2, (combination / 4) % 4,
                    combination % 4);
#endif
}

// Fragment f, lane l: a[(f·32 + l)·4 + i], b[(f·32 + l)·2 + i], c and d like a, sfa[f·32 + l], sfb likewise.
template <class I>
__global__ void __launch_bounds__(PROBE_WARPS * 32)
    block_scaled_mma_probe_kernel(const uint32_t* __restrict__ a, const uint32_t* __restrict__ b,
                                  const float* __restrict__ c, const uint32_t* __restrict__ sfa,
                                  const uint32_t* __restrict__ sfb, float* __restrict__ d, int fragments,
                                  int combination) {
  const int lane = threadIdx.x & 31;
  // warp-uniform: the whole warp takes each fragment together
  for (int f = blockIdx.x * PROBE_WARPS + int(threadIdx.x >> 5); f < fragments; f += gridDim.x * PROBE_WARPS) {
    const size_t l = size_t(f) * 32 + lane;
    uint32_t ra[4], rb[2];
    float rc[4], rd[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) ra[i] = a[l * 4 + i], rc[i] = c[l * 4 + i];
#pragma unroll
    for (int i = 0; i < 2; ++i) rb[i] = b[l * 2 + i];
    mma_of<I>(combination, rd, ra, rb, rc, sfa[l], sfb[l], std::make_integer_sequence<int, 128>{});
#pragma unroll
    for (int i = 0; i < 4; ++i) d[l * 4 + i] = rd[i];
  }
}

template <class I>
bool valid(int ba, int ta, int bb, int tb) {
  return bsmma::valid_selectors<I>(ba, ta, bb, tb);
}

}  // namespace

const char* block_scaled_mma_probe_error(int kind, int byte_id_a, int thread_id_a, int byte_id_b, int thread_id_b) {
  bool ok = false;
  switch (kind) {
    case bsmma::KIND_NVFP4: ok = valid<bsmma::NVFP4>(byte_id_a, thread_id_a, byte_id_b, thread_id_b); break;
    case bsmma::KIND_MXF4: ok = valid<bsmma::MXF4>(byte_id_a, thread_id_a, byte_id_b, thread_id_b); break;
    case bsmma::KIND_MXF8: ok = valid<bsmma::MXF8>(byte_id_a, thread_id_a, byte_id_b, thread_id_b); break;
    case bsmma::KIND_MXF4_MXF8: ok = valid<bsmma::MXF4_MXF8>(byte_id_a, thread_id_a, byte_id_b, thread_id_b); break;
    default: return "block_scaled_mma_probe: kind must be 0 .. 3 (b12x_kernels.block_scaled_mma.kind_id)";
  }
  return ok ? nullptr
            : "block_scaled_mma_probe: byte-id / thread-id outside the PTX ISA's Table 40 for this instruction "
              "(byte-id 0-3 for scale_vec::1X, 0 or 2 for 2X, 0 for 4X; thread-id-a 0-1, thread-id-b 0-3)";
}

cudaError_t block_scaled_mma_probe(int kind, const uint32_t* a, const uint32_t* b, const float* c,
                                   const uint32_t* sfa, const uint32_t* sfb, float* d, int fragments, int byte_id_a,
                                   int thread_id_a, int byte_id_b, int thread_id_b, cudaStream_t stream) {
  if (block_scaled_mma_probe_error(kind, byte_id_a, thread_id_a, byte_id_b, thread_id_b) || fragments < 0)
    return cudaErrorInvalidValue;
  if (fragments == 0) return cudaSuccess;
  const int combination = ((byte_id_a * 2 + thread_id_a) * 4 + byte_id_b) * 4 + thread_id_b;
  const int blocks = (fragments + PROBE_WARPS - 1) / PROBE_WARPS;
  const dim3 grid(blocks < 65536 ? blocks : 65536), block(PROBE_WARPS * 32);
  switch (kind) {
    case bsmma::KIND_NVFP4:
      return launch_kernel(false, block_scaled_mma_probe_kernel<bsmma::NVFP4>, grid, block, 0, stream, a, b, c, sfa,
                           sfb, d, fragments, combination);
    case bsmma::KIND_MXF4:
      return launch_kernel(false, block_scaled_mma_probe_kernel<bsmma::MXF4>, grid, block, 0, stream, a, b, c, sfa,
                           sfb, d, fragments, combination);
    case bsmma::KIND_MXF8:
      return launch_kernel(false, block_scaled_mma_probe_kernel<bsmma::MXF8>, grid, block, 0, stream, a, b, c, sfa,
                           sfb, d, fragments, combination);
    default:
      return launch_kernel(false, block_scaled_mma_probe_kernel<bsmma::MXF4_MXF8>, grid, block, 0, stream, a, b, c,
                           sfa, sfb, d, fragments, combination);
  }
}

}  // namespace b12x
