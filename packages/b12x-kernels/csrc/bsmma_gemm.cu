// bsmma_gemm: a linear on SM12x's block-scaled mma.sync (block_scaled_mma.cuh), the weight as the A operand (16 rows
// a warp), the tokens as B (8 a fragment), fp32 accumulation in the instruction's C/D registers:
//
//   y[m, n] = row_scale[n] · sum_k x̂[m, k] · W[n, k] (+ bias[n]), bf16 out
//
// for the three pairs of BSMMA_KINDS: NVFP4 × nvfp4 (NVFP4: m16n8k64 e2m1, UE4M3 per 16), MXFP8 × mxfp8 (MXF8:
// m16n8k32 e4m3, E8M0 per 32) and MXFP4 × mxfp8 (MXF4_MXF8: e2m1 × e4m3, E8M0 per 32). On sm_120a / sm_121a each
// mma is the instruction; in the sm_90 build it is the instruction's exact model (bsmma::emulate), so every other line
// here runs and is tested on Hopper.
//
// A call is two launches:
// 1. bsmma_quantize: x (bf16 [M, K]) -> codes + scale bytes by b12x_core.activations' rules (the same float32
//    operations, each correctly rounded, as mma_gemm.cuh's quantize_pieces): nvfp4 sf = e4m3(amax / 6 · g),
//    e2m1(x · g / sf) (g = 1 / input_scale, BsmmaArgs::x_scale; input_scale is in row_scale); mxfp8 e8m0 exponent
//    floor(log2 amax) − 8, e4m3(x / 2^e). Row m's codes are K in order (e2m1 two a byte, low nibble first; e4m3 a
//    byte), its scales one byte a block, both over K padded to whole units of BSMMA_UNIT_K (zeros past K quantize to
//    zero codes and the zero / smallest scale).
// 2. bsmma_gemm: each warp one 16-row weight tile against 8·mt tokens, unit by unit: its lane's A registers of the
//    unit in one or more 16-byte loads (b12x_core.block_scaled.layout repacks the weight into that order), scale-a-data
//    in one load, each token fragment's B registers two 4-byte loads a step (the fragment tables put a lane's K
//    pieces of one token 16 bytes apart), scale-b-data one load.
// FP8 × fp8 (BSMMA_KIND_FP8) runs the same GEMM on the plain E4M3 mma.sync m16n8k32 (sm_89+: native in both builds):
// MXF8's fragments and weight layout without scale words; its activations are e4m3 codes from the fp8 pass
// (b12x_core.activations' rules, K % BSMMA_UNIT_K == 0), their per-token scale (fp8_token) in x_row_scale, a static
// one in row_scale.
// The grouped form (bsmma_mma with a block table, b12x_core.moe_blocks): CTA row y is table block y, expert e's
// sorted rows [start, start + count) against expert e's weight, `expert_codes` / `expert_scales` bytes apart (idle
// blocks, expert −1, return). The MoE's passes apply the row factors; y is float32 there.
// Selectors: always byte-id = thread-id = 0 (the only ones CUTLASS issues, so the ones known on hardware); the scale
// words of a unit's k-steps are shifted into byte 0 instead.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_fp16.h>

#include "block_scaled_mma.cuh"
#include "kernels.h"
#include "launch.cuh"

namespace b12x {
namespace {

constexpr int WARPS = 4;  // weight tiles (16 rows) a CTA
constexpr int UNIT = BSMMA_UNIT_K;

// The plain E4M3 mma.sync m16n8k32: the fields of block_scaled_tables.h's instructions that the GEMM reads, as MXF8's
// fragments (the same A / B / C tables for 8-bit types), without scales.
struct FP8 {
  struct btype {
    static constexpr int bits = 8;
  };
  static constexpr int kind = BSMMA_KIND_FP8, k = 32, scale_vec = 1, block = 32;
};

__device__ __forceinline__ void mma_fp8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// What a unit of K is for instruction I: `steps` instructions; each lane's `a_bytes` of weight codes (16-byte loads)
// and `sfa_bytes` of scale-a-data words (one word a step for NVFP4's four scales, one word of four steps' single
// scales for the 1X instructions); a token's `x_bytes` of codes and `xs_bytes` of scales.
template <class I>
struct Unit {
  static constexpr int steps = UNIT / I::k;
  static constexpr bool scaled = I::kind != BSMMA_KIND_FP8;
  static constexpr bool packed_a = I::kind == bsmma::KIND_MXF4_MXF8;  // e2m1 stored 2 a byte, widened here
  static constexpr int a_bytes = steps * (packed_a ? 8 : 16);
  static constexpr int sfa_bytes = !scaled ? 0 : I::scale_vec == 4 ? 4 * steps : 4;
  static constexpr int x_bytes = UNIT * I::btype::bits / 8;
  static constexpr int xs_bytes = scaled ? UNIT / I::block : 0;
  static_assert(steps * 32 == x_bytes, "a step is 32 bytes of a token's codes");
  static_assert(I::scale_vec == 4 || (I::scale_vec == 1 && steps == 4), "scale words: one a step, or one a unit");
  static_assert(xs_bytes == sfa_bytes, "a token's scales of a unit are laid out as a row's");
};

// Four e2m1 codes (16 bits, low nibble first) -> the .kind::mxf8f6f4 register: a byte each, the code in bits 2-5.
__device__ __forceinline__ uint32_t widen_e2m1(uint32_t h) {
  const uint32_t x = (h & 0x00FFu) | ((h & 0xFF00u) << 8);
  return ((x & 0x000F000Fu) | ((x & 0x00F000F0u) << 4)) << 2;
}

__device__ __forceinline__ uint32_t e4m3_code(float v) {  // nearest E4M3, ties to even, saturating at ±448
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float e4m3_value(uint32_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(code), __NV_E4M3)));
}
// The code of the nearest of {0, .5, 1, 1.5, 2, 3, 4, 6} (ties to the even code, saturating: activations.round_e2m1).
__device__ __forceinline__ uint32_t e2m1_code(float v) {
  const float a = fabsf(v);
  uint32_t c = a <= 0.25f ? 0u : 1u;
  c = a >= 0.75f ? 2u : c;
  c = a > 1.25f ? 3u : c;
  c = a >= 1.75f ? 4u : c;
  c = a > 2.5f ? 5u : c;
  c = a >= 3.5f ? 6u : c;
  c = a > 5.f ? 7u : c;
  return v < 0.f ? c | 8u : c;
}

// One thread a scale block of one token: G values quantized, their codes and scale byte stored.
template <class I>
__global__ void __launch_bounds__(256)
    bsmma_quantize_kernel(const __nv_bfloat16* __restrict__ x, uint8_t* __restrict__ xq, uint8_t* __restrict__ xs,
                          int M, int K, int units, float g) {
  constexpr int G = I::block;
  using U = Unit<I>;
  grid_dependency_wait();
  const int blocks_a_row = units * U::xs_bytes;
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)M * blocks_a_row) return;
  const int m = int(i / blocks_a_row), blk = int(i % blocks_a_row);
  const __nv_bfloat16* row = x + size_t(m) * K;
  float f[G];
  float amax = 0.f;
#pragma unroll
  for (int e = 0; e < G; ++e) {
    const int k = blk * G + e;
    f[e] = k < K ? __bfloat162float(row[k]) : 0.f;
    amax = fmaxf(amax, fabsf(f[e]));
  }
  uint8_t* codes = xq + size_t(m) * units * U::x_bytes + size_t(blk) * G * I::btype::bits / 8;
  if constexpr (I::kind == bsmma::KIND_NVFP4) {  // sf = e4m3(amax / 6 · g); e2m1(x · g / sf)
    const uint32_t sf_code = e4m3_code(__fmul_rn(__fdiv_rn(amax, 6.f), g));
    const float sf = e4m3_value(sf_code);
    const float out = sf > 0.f ? __fdiv_rn(g, sf) : 0.f;
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < G; ++e) w[e / 8] |= e2m1_code(__fmul_rn(f[e], out)) << (4 * (e % 8));
    *reinterpret_cast<uint2*>(codes) = make_uint2(w[0], w[1]);
    xs[size_t(m) * blocks_a_row + blk] = uint8_t(sf_code);
  } else {  // mxfp8: s = 2^(floor(log2 amax) − 8), e4m3(x / s)
    const int biased = int((__float_as_uint(amax) >> 23) & 255u);
    const int exponent = amax > 0.f ? max(biased - 127 - 8, -127) : -127;
    const float inv = __uint_as_float(uint32_t(127 - exponent) << 23);
    uint32_t w[G / 4] = {};
#pragma unroll
    for (int e = 0; e < G; ++e) w[e / 4] |= e4m3_code(__fmul_rn(f[e], inv)) << (8 * (e % 4));
#pragma unroll
    for (int v = 0; v < G / 16; ++v)
      reinterpret_cast<uint4*>(codes)[v] = make_uint4(w[4 * v], w[4 * v + 1], w[4 * v + 2], w[4 * v + 3]);
    xs[size_t(m) * blocks_a_row + blk] = uint8_t(exponent + 127);
  }
  grid_dependents_launch();
}

// Weight tile `tile` (rows 16·tile ..) × 8·MT sorted rows of xq / y: rows [8·MT·blockIdx.y, ..) below M, or table
// block blockIdx.y's (grouped). Layouts (block_scaled.layout): codes [tile][unit][lane][a_bytes], scales
// [tile][unit][slot][sfa_bytes] with slot 2·(lane / 4) + lane % 2 (lanes 4g and 4g + 1 supply rows g and g + 8 under
// thread-id-a 0; lanes 4g + 2, 4g + 3 load the same word, unread).
template <class I, int MT>
__global__ void __launch_bounds__(WARPS * 32)
    bsmma_gemm_kernel(const BsmmaArgs p, const uint8_t* __restrict__ xq, const uint8_t* __restrict__ xs,
                      const float* __restrict__ x_row_scale, const int* __restrict__ table, int blocks,
                      const __nv_bfloat16* __restrict__ bias, void* __restrict__ y, int M) {
  using U = Unit<I>;
  const int lane = int(threadIdx.x & 31), tile = int(blockIdx.x) * WARPS + int(threadIdx.x >> 5);
  const int g = lane >> 2, t = lane & 3;
  grid_dependency_wait();
  if (tile * 16 >= p.N) return;  // a whole warp: no mma.sync of it is missing a lane
  const uint8_t* codes = p.codes;
  const uint8_t* scales = p.scales;
  int row0 = int(blockIdx.y) * 8 * MT, rows = min(8 * MT, M - row0);
  if (table) {  // the whole CTA reads the same block
    const int e = table[blockIdx.y];
    if (e < 0) return;
    row0 = table[blocks + blockIdx.y], rows = table[2 * blocks + blockIdx.y];
    codes += size_t(e) * unsigned(p.expert_codes), scales += size_t(e) * unsigned(p.expert_scales);
  }
  if (rows <= 0) return;
  const uint8_t* xrow[MT];  // this lane's row (its B column) of each fragment; past the block: its last row, unstored
  const uint8_t* srow[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    const int m = row0 + min(8 * j + g, rows - 1);
    xrow[j] = xq + size_t(m) * p.units * U::x_bytes + 4 * t;
    srow[j] = xs + size_t(m) * p.units * U::xs_bytes;
  }
  const uint8_t* wa = codes + (size_t(tile) * p.units * 32 + lane) * U::a_bytes;
  const uint8_t* ws = scales + (size_t(tile) * p.units * 16 + 2 * g + (lane & 1)) * U::sfa_bytes;
  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  // Step `step` (of the whole K) of fragment j: its registers straight from their loads (a unit's layout is its steps
  // in order; `s` the step within its unit).
  auto mma_step = [&](int step, int j) {
    const int u = step / U::steps, s = step % U::steps;
    const uint8_t* wu = wa + size_t(u) * 32 * U::a_bytes;
    uint32_t a[4];
    if constexpr (U::packed_a) {  // four registers of 16 bits each, in 8 bytes
      const uint2 w = __ldg(reinterpret_cast<const uint2*>(wu) + s);
      a[0] = widen_e2m1(w.x & 0xFFFFu), a[1] = widen_e2m1(w.x >> 16);
      a[2] = widen_e2m1(w.y & 0xFFFFu), a[3] = widen_e2m1(w.y >> 16);
    } else {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(wu) + s);
      a[0] = w.x, a[1] = w.y, a[2] = w.z, a[3] = w.w;
    }
    const uint8_t* x = xrow[j] + size_t(u) * U::x_bytes + 32 * s;
    const uint32_t b[2] = {*reinterpret_cast<const uint32_t*>(x), *reinterpret_cast<const uint32_t*>(x + 16)};
    if constexpr (!U::scaled) {
      mma_fp8(acc[j], a, b);
    } else {
      // 4X: a word a step; 1X: byte s of the unit's word, moved to byte 0 (selector byte-id 0)
      const uint32_t* sa = reinterpret_cast<const uint32_t*>(ws + size_t(u) * 16 * U::sfa_bytes);
      const uint32_t sfa = I::scale_vec == 4 ? __ldg(sa + s) : __ldg(sa) >> (8 * s);
      const uint32_t* sb = reinterpret_cast<const uint32_t*>(srow[j] + size_t(u) * U::xs_bytes);
      const uint32_t sfb = I::scale_vec == 4 ? sb[s] : sb[0] >> (8 * s);
      bsmma::mma<I, 0, 0, 0, 0>(acc[j], a, b, acc[j], sfa, sfb);
    }
  };
  const int steps = p.units * U::steps;
#ifdef B12X_BSMMA_NATIVE
  constexpr bool interleave = true;
#else
  constexpr bool interleave = !U::scaled;  // the plain E4M3 mma.sync is native in both builds
#endif
  if constexpr (interleave) {
    // every fragment a step, so each weight load feeds MT instructions
#pragma unroll 2
    for (int step = 0; step < steps; ++step) {
#pragma unroll
      for (int j = 0; j < MT; ++j) mma_step(step, j);
    }
  } else {
    // The exact model is long: one fragment at a time, its step loop rolled (compile time, registers; the loads
    // repeat per fragment, from cache). The same loads and instructions, in another order.
    static_for<MT>([&](auto j) {
#pragma unroll 1
      for (int step = 0; step < steps; ++step) mma_step(step, j);
    });
  }
  grid_dependents_launch();

  // D element i of fragment j: weight row 16·tile + g + 8·(i / 2), row row0 + 8j + 2t + i % 2 (the C/D table)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int n = tile * 16 + g + 8 * (i / 2);
    if (n >= p.N) continue;
    const float scale = p.row_scale ? __ldg(p.row_scale + n) : 1.f;
    const float b = bias ? __bfloat162float(bias[n]) : 0.f;
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      const int local = 8 * j + 2 * t + (i % 2);
      if (local >= rows) continue;
      const size_t m = size_t(row0 + local);
      float v = __fmul_rn(acc[j][i], scale);
      if (x_row_scale) v = __fmul_rn(v, __ldg(x_row_scale + m));
      v = v + b;
      if (p.out_f32) {
        static_cast<float*>(y)[m * p.ldy + n] = v;
      } else {
        static_cast<__nv_bfloat16*>(y)[m * p.ldy + n] = __float2bfloat16_rn(v);
      }
    }
  }
}

template <class I>
cudaError_t launch_quantize(const BsmmaArgs& p, const __nv_bfloat16* x, uint8_t* xq, uint8_t* xs, int M,
                            cudaStream_t stream) {
  const long long blocks = ((long long)M * p.units * Unit<I>::xs_bytes + 255) / 256;
  return launch_kernel(p.pdl != 0, bsmma_quantize_kernel<I>, dim3(unsigned(blocks)), dim3(256), 0, stream, x, xq, xs,
                       M, p.K, p.units, p.x_scale);
}

template <class I>
cudaError_t launch_mma(const BsmmaArgs& p, const uint8_t* xq, const uint8_t* xs, const float* x_row_scale,
                       const int* table, int blocks, const __nv_bfloat16* bias, void* y, int M, cudaStream_t stream) {
  const int tiles = (p.N + 15) / 16;
  const dim3 block(WARPS * 32);
  const unsigned cols = unsigned((tiles + WARPS - 1) / WARPS);
  if (p.mt == 1) {
    return launch_kernel(p.pdl != 0, bsmma_gemm_kernel<I, 1>, dim3(cols, table ? blocks : (M + 7) / 8), block, 0,
                         stream, p, xq, xs, x_row_scale, table, blocks, bias, y, M);
  }
  return launch_kernel(p.pdl != 0, bsmma_gemm_kernel<I, 4>, dim3(cols, table ? blocks : (M + 31) / 32), block, 0,
                       stream, p, xq, xs, x_row_scale, table, blocks, bias, y, M);
}

}  // namespace

const char* bsmma_args_error(const BsmmaArgs& p) {
  if (p.kind != bsmma::KIND_NVFP4 && p.kind != bsmma::KIND_MXF8 && p.kind != bsmma::KIND_MXF4_MXF8 &&
      p.kind != BSMMA_KIND_FP8)
    return "bsmma_gemm: kind must be NVFP4, MXF8, MXF4_MXF8 (b12x_kernels.block_scaled_mma.kind_id) or BSMMA_KIND_FP8";
  if (!p.codes || (reinterpret_cast<uintptr_t>(p.codes) % 16) ||
      (p.kind != BSMMA_KIND_FP8 && (!p.scales || reinterpret_cast<uintptr_t>(p.scales) % 8)))
    return "bsmma_gemm: null or misaligned weight codes (16 bytes) / scales (8 bytes)";
  if (p.N < 1 || p.K < 1 || p.units < 1 || p.units * BSMMA_UNIT_K < p.K || p.ldy < p.N)
    return "bsmma_gemm: need N, K >= 1, units · BSMMA_UNIT_K >= K and ldy >= N";
  if (p.kind == BSMMA_KIND_FP8 && p.units * BSMMA_UNIT_K != p.K)
    return "bsmma_gemm: FP8 reads the fp8 pass's rows of K codes: K must be units · BSMMA_UNIT_K";
  if (p.mt != 1 && p.mt != 4) return "bsmma_gemm: mt must be 1 or 4";
  if (p.expert_codes < 0 || p.expert_scales < 0 || p.expert_codes % 16 || p.expert_scales % 8)
    return "bsmma_gemm: expert_codes / expert_scales must be >= 0 and keep 16- / 8-byte alignment";
  return nullptr;
}

size_t bsmma_x_bytes(int kind, int M, int units, bool scales) {
  switch (kind) {
    case bsmma::KIND_NVFP4:
      return size_t(M) * units * (scales ? Unit<bsmma::NVFP4>::xs_bytes : Unit<bsmma::NVFP4>::x_bytes);
    case bsmma::KIND_MXF8:
      return size_t(M) * units * (scales ? Unit<bsmma::MXF8>::xs_bytes : Unit<bsmma::MXF8>::x_bytes);
    case bsmma::KIND_MXF4_MXF8:
      return size_t(M) * units * (scales ? Unit<bsmma::MXF4_MXF8>::xs_bytes : Unit<bsmma::MXF4_MXF8>::x_bytes);
    case BSMMA_KIND_FP8: return size_t(M) * units * (scales ? Unit<FP8>::xs_bytes : Unit<FP8>::x_bytes);
    default: return 0;
  }
}

cudaError_t bsmma_quantize(const BsmmaArgs& p, const __nv_bfloat16* x, uint8_t* xq, uint8_t* xs, int M,
                           cudaStream_t stream) {
  if (bsmma_args_error(p) || M < 0 || p.kind == BSMMA_KIND_FP8) return cudaErrorInvalidValue;
  if (M == 0) return cudaSuccess;
  switch (p.kind) {
    case bsmma::KIND_NVFP4: return launch_quantize<bsmma::NVFP4>(p, x, xq, xs, M, stream);
    case bsmma::KIND_MXF8: return launch_quantize<bsmma::MXF8>(p, x, xq, xs, M, stream);
    default: return launch_quantize<bsmma::MXF4_MXF8>(p, x, xq, xs, M, stream);
  }
}

cudaError_t bsmma_mma(const BsmmaArgs& p, const uint8_t* xq, const uint8_t* xs, const float* x_row_scale,
                      const int* table, int blocks, const __nv_bfloat16* bias, void* y, int M, cudaStream_t stream) {
  if (bsmma_args_error(p) || M < 0 || (table && blocks < 1)) return cudaErrorInvalidValue;
  if (M == 0) return cudaSuccess;
  switch (p.kind) {
    case bsmma::KIND_NVFP4:
      return launch_mma<bsmma::NVFP4>(p, xq, xs, x_row_scale, table, blocks, bias, y, M, stream);
    case bsmma::KIND_MXF8: return launch_mma<bsmma::MXF8>(p, xq, xs, x_row_scale, table, blocks, bias, y, M, stream);
    case bsmma::KIND_MXF4_MXF8:
      return launch_mma<bsmma::MXF4_MXF8>(p, xq, xs, x_row_scale, table, blocks, bias, y, M, stream);
    default: return launch_mma<FP8>(p, xq, xs, x_row_scale, table, blocks, bias, y, M, stream);
  }
}

cudaError_t bsmma_gemm(const BsmmaArgs& p, const __nv_bfloat16* x, uint8_t* xq, uint8_t* xs,
                       const __nv_bfloat16* bias, __nv_bfloat16* y, int M, cudaStream_t stream) {
  if (bsmma_args_error(p) || M < 0 || p.kind == BSMMA_KIND_FP8 || p.out_f32) return cudaErrorInvalidValue;
  if (M == 0) return cudaSuccess;
  const cudaError_t err = bsmma_quantize(p, x, xq, xs, M, stream);
  if (err != cudaSuccess) return err;
  return bsmma_mma(p, xq, xs, nullptr, nullptr, 0, bias, y, M, stream);
}

}  // namespace b12x
