#pragma once
// Tensor-core mixed-input GEMM (Marlin class) for every b12x weight format with bf16-valued activations:
//   y[m, n] = alpha * sum_k x[m, k] * W[n, k] (+ bias[n])
//
// Why this shape (the GEMV and dequantize-to-bf16 paths it replaces could not beat bf16 above one token):
// - Weights are the MMA's A operand (m16 = 16 weight rows), tokens its B operand (n8 = 8 tokens), so a
//   decode-sized call pads tokens to 8, not to 16, and every weight byte is read once per token tile.
// - The weight is repacked at prepare time (by the host, losslessly) into 1 KB tiles: 16 rows × one
//   "chunk" of K, stored as two 512-byte halves (rows 0-7, rows 8-15) in lane order. A warp reads a half with
//   one coalesced 16-byte load per lane. Lane (q = lane/4, t = lane%4) gets row q (and q+8) and the t-th
//   16-byte quarter of the chunk: E consecutive elements (E = 16 for 8-bit codes, 32 for FP4, 64 for IQ2).
// - The MMA's k order is free as long as A and B agree, so lane t's MMA k slots hold *its own* E elements:
//   step s uses lane elements 4s..4s+3 (slots 2t,2t+1 <- 4s,4s+1 and 2t+8,2t+9 <- 4s+2,4s+3). B then needs
//   x[token, kchunk + E·t + 4s .. +4): contiguous, one 16-byte shared-memory load per two steps.
// - Codes are decoded in registers straight into bf16 A fragments with shifts/masks (E2M1, E4M3 as
//   bf16 bit patterns scaled by an exact power of two), byte permutes (IQ2 grid values through a 6-entry
//   PRMT table; Q8_0 through the 2^23 float trick), then multiplied by their block scale in bf16. E2M1·E8M0,
//   E2M1·E4M3 and E4M3·E8M0 products are exact in bf16; Q8_0 (q·d) and IQ2 (grid·d·(0.5+s)/4) round once
//   to bf16 (2^-9 relative, inside the kernels' closeness contract); FP8_BLOCK's fp32 scale multiplies the
//   fp32 accumulator per chunk instead (exact); per-tensor scales multiply the result (alpha).
// - Activations for a token tile are staged in shared memory per K stage by cp.async, double buffered;
//   weights stream through a register ring D chunks deep, so ~4 KB per warp are in flight.
// - Split-K fills the GPU at small N: each split writes fp32 partials, the last CTA of an output tile (an
//   atomic ticket) sums them in split order — deterministic, no atomics on data — and resets the ticket.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>
#include <utility>

#include "kernels.h"
#include "launch.cuh"
#include "static_for.cuh"

namespace b12x {
namespace mma {

constexpr int kWarps = MMA_TILES_PER_CTA;  // row tiles (of 16) per CTA: 128 rows, 8 / RT warps
// Row tiles per CTA, TILES: kWarps for every configuration, and 6 or 7 (6 or 7 warps) for the one-token tile of one
// row tile a warp (MmaArgs::tiles). At one token a CTA streams its weights for the whole call and one wave holds every
// CTA: 224 CTAs of 128 rows (Llama-3.1-8B's gate_up) give 92 of 132 SMs two CTAs and 40 one, and the time is the
// busy SMs'; 112-row CTAs (256) give nearly every SM two (configure.balanced_config picks the height).
constexpr int kStages = 4;  // per-warp shared-memory ring of weight chunks: kStages - 1 in flight
// IQ2 tables: 16 copies spread over banks, so at most 2 lanes share a bank. 8 would halve IQ2_XS's 40 KB of tables
// and let its grouped (MoE) CTAs fit SM12x's 99 KB a block; on Hopper it times the same (tools/kernel_ab.sh with the
// value changed, then `benchmarks/mma_linear.py --model 8b --per-linear --formats IQ2_XS,IQ2_XXS --ms 1,4,8`), so it
// waits for SM12x's GPU tests. A power of two: a word index's byte offset is a shift.
constexpr int kReplicas = 16;
constexpr int kReplicaShift =  // log2 of a word's replicas in bytes
    kReplicas == 4 ? 4 : kReplicas == 8 ? 5 : kReplicas == 16 ? 6 : kReplicas == 32 ? 7 : -1;
static_assert(kReplicaShift > 0, "IQ2 table replicas: 4, 8, 16 or 32 (a word index's byte offset is a shift)");

// The kernel's parameters: the host's arguments plus what it derives from them once.
struct MmaParams : MmaArgs, MmaCall {
  int n16;                  // 16-row tiles per expert (the whole weight when not grouped)
  int chunks_per_split;     // K chunks each split walks
  const int* block_expert;  // grouped: the block table's rows (MmaCall::table)
  const int* block_start;
  const int* block_rows;
  // Grouped (a fused MoE's GEMMs): routed by a block table (order) or in the kernel (ids); a CTA a table block.
  __host__ __device__ bool grouped() const { return order != nullptr || ids != nullptr; }
};

// ---------------------------------------------------------------------------------------------- helpers
__device__ __forceinline__ uint32_t bmul(uint32_t a, uint32_t b) {  // bf16x2 a*b, subnormals kept
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// A 32-bit shared-memory load at a shared-window address (plus a constant byte offset the load encodes).
__device__ __forceinline__ uint32_t ld_shared(uint32_t addr) {
  uint32_t v;
  asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
template <int OFFSET>
__device__ __forceinline__ uint32_t ld_shared_at(uint32_t addr) {
  uint32_t v;
  asm("ld.shared.u32 %0, [%1+%2];" : "=r"(v) : "r"(addr), "n"(OFFSET));
  return v;
}
__device__ __forceinline__ uint32_t splat_bf16(float f) {  // f must be exact in bf16
  const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(f));
  return h | (h << 16);
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float e8m0_to_float(uint32_t b) {
  return b == 0 ? __int_as_float(0x00400000) : __int_as_float(int(b) << 23);  // 2^(b-127)
}
__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3)));
}
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {  // i is a compile-time constant
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// E4M3 byte pair -> bf16x2 bit patterns worth value·2^-120 (the exponent field moves from 4 to 8 bits
// unchanged, subnormals included). The repack puts a pair's two bytes at bytes (0, 2) or (1, 3) of a word.
__device__ __forceinline__ uint32_t e4m3_pair_lo(uint32_t w) {
  return ((w << 4) & 0x07F007F0u) | ((w << 8) & 0x80008000u);
}
__device__ __forceinline__ uint32_t e4m3_pair_hi(uint32_t w) {
  return ((w >> 4) & 0x07F007F0u) | (w & 0x80008000u);
}
// Activations quantized where the resident kernel holds them (MmaArgs::x_quant, MmaXQuant), by the rules of
// b12x_kernels.act_quant, whose separate pass (a launch before the GEMM) this replaces: the same float32 operations
// in the same order, each correctly rounded (no contraction: __fmul_rn / __fdiv_rn), so the same bf16 values.
__device__ __forceinline__ float round_e4m3(float v) {  // nearest E4M3, ties to even, saturating at ±448
  const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}
__device__ __forceinline__ float round_e2m1(float v) {  // nearest of {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even code
  const float a = fabsf(v);
  float r = a <= 0.25f ? 0.f : 0.5f;
  r = a >= 0.75f ? 1.f : r;
  r = a > 1.25f ? 1.5f : r;
  r = a >= 1.75f ? 2.f : r;
  r = a > 2.5f ? 3.f : r;
  r = a >= 3.5f ? 4.f : r;
  r = a > 5.f ? 6.f : r;
  return v < 0.f ? -r : r;
}
// G 16-byte pieces of one row (8·G consecutive values from a scale group's start: mxfp8 groups are 4 pieces, nvfp4's
// 2, fp8 static has none) quantized in place. `scale`: fp8 static's divisor, nvfp4's global scale (1 / input_scale).
template <int XQ, int G>
__device__ __forceinline__ void quantize_pieces(uint4 (&v)[G], float scale) {
  static_assert(XQ == MMA_XQ_FP8_STATIC || (XQ == MMA_XQ_MXFP8 && G == 4) || (XQ == MMA_XQ_NVFP4 && G == 2));
  float f[8 * G];
#pragma unroll
  for (int i = 0; i < 4 * G; ++i) {
    const uint32_t w = reinterpret_cast<const uint32_t*>(&v[i / 4])[i % 4];
    const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
    f[2 * i] = pair.x;
    f[2 * i + 1] = pair.y;
  }
  float amax = 0.f;
#pragma unroll
  for (int e = 0; e < 8 * G; ++e) amax = fmaxf(amax, fabsf(f[e]));
  if constexpr (XQ == MMA_XQ_FP8_STATIC) {  // e4m3(x / scale)
#pragma unroll
    for (int e = 0; e < 8 * G; ++e) f[e] = round_e4m3(__fdiv_rn(f[e], scale));
  } else if constexpr (XQ == MMA_XQ_MXFP8) {  // s = 2^(floor(log2 amax) - 8), e4m3(x / s) · s
    const int biased = int((__float_as_uint(amax) >> 23) & 255u);
    const int exponent = amax > 0.f ? max(biased - 127 - 8, -127) : -127;
    const float s = exponent >= -126 ? __uint_as_float(uint32_t(exponent + 127) << 23) : 5.877471754111438e-39f;
    const float inv = __uint_as_float(uint32_t(127 - exponent) << 23);
#pragma unroll
    for (int e = 0; e < 8 * G; ++e) f[e] = __fmul_rn(round_e4m3(__fmul_rn(f[e], inv)), s);
  } else {  // nvfp4 without its per-tensor factor: sf = e4m3(amax / 6 · g), e2m1(x · g / sf) · sf
    const float sf = round_e4m3(__fmul_rn(__fdiv_rn(amax, 6.f), scale));
    const float out = sf > 0.f ? __fdiv_rn(scale, sf) : 0.f;
#pragma unroll
    for (int e = 0; e < 8 * G; ++e) f[e] = __fmul_rn(round_e2m1(__fmul_rn(f[e], out)), sf);
  }
#pragma unroll
  for (int i = 0; i < 4 * G; ++i) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    reinterpret_cast<uint32_t*>(&v[i / 4])[i % 4] = *reinterpret_cast<const uint32_t*>(&b);
  }
}
// 16-byte pieces a quantization group spans (the unit a thread loads, quantizes and stores).
__host__ __device__ constexpr int xq_pieces(int xq) { return xq == MMA_XQ_MXFP8 ? 4 : xq == MMA_XQ_NVFP4 ? 2 : 1; }
// ---------------------------------------------------------------------------------------------- formats
// Each format says: E (elements of one row per lane per chunk), KB (K per chunk), META / META2 (scale bytes per
// row and chunk in `meta` / `meta2`), how a lane builds its per-chunk scale state S for one row from those bytes,
// decode8<G>: lane elements 8G..8G+7 of that row as four bf16x2 pairs (pair i = elements 8G+2i, 8G+2i+1), and
// ACC: whether a per-row fp32 factor multiplies the chunk's partial sums instead (acc_scale).
// `mul` (MmaParams::scale_mul) is the power of two that brings bit-pattern decodes into range: the host picks it
// so every block scale times it fits bf16, and folds its inverse into alpha.
// BIAS: decode8 gives value·2^-BIAS (before `mul`); the host's alpha takes 2^BIAS back (layout._BIT_PATTERN_BIAS).
struct FmtFP8 {  // per-tensor FP8 (scale in alpha)
  static constexpr int E = 16, KB = MMA_CHUNK_K_FP8, META = 0, META2 = 0, BIAS = 120;
  static constexpr bool ACC = false;
  struct S {
    uint32_t mul;
  };
  __device__ static S scale(const uint8_t*, const uint8_t*, int, const uint4&, float mul) { return {splat_bf16(mul)}; }
  template <int G>
  __device__ static void decode8(const uint4& q, const S& s, const uint32_t*, int, uint32_t (&a)[4]) {
    const uint32_t w0 = word(q, 2 * G), w1 = word(q, 2 * G + 1);
    a[0] = bmul(e4m3_pair_lo(w0), s.mul);
    a[1] = bmul(e4m3_pair_hi(w0), s.mul);
    a[2] = bmul(e4m3_pair_lo(w1), s.mul);
    a[3] = bmul(e4m3_pair_hi(w1), s.mul);
  }
};

struct FmtFP8Block : FmtFP8 {  // FP8_BLOCK: one fp32 scale per 128 rows × 128 k multiplies the partial sums
  static constexpr bool ACC = true;
};

static_assert(MMA_CHUNK_K_FP8_BLOCK == FmtFP8::KB && MMA_CHUNK_K_MXFP8 == FmtFP8::KB, "one 8-bit chunk");

struct FmtMXFP8 : FmtFP8 {  // two E8M0 scales (32 weights each) per row and chunk; lane t uses scale t/2
  static constexpr int META = 2;
  __device__ static S scale(const uint8_t* m, const uint8_t*, int t, const uint4&, float mul) {
    return {splat_bf16(e8m0_to_float(m[t >> 1]) * mul)};
  }
};

// E2M1 pair p of a repacked word (the bit fields below; the host repack places codes there) -> bf16x2 bit
// patterns worth value·2^-126:
// pairs 0-2 sit at bf16's spacing (magnitude at L..L+2, sign at L+9, L = 6, 3, 0; high element +16), so one
// shift and one mask move them to bits 6-8 / 15 and 22-24 / 31; pair 3 fills the four positions left.
template <int P>
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t w) {
  if constexpr (P < 3) {
    return (w << (3 * P)) & 0x81C081C0u;  // L = 6 - 3P: shift by 6 - L
  } else {
    return ((w >> 4) & 0x00C000C0u) | ((w >> 5) & 0x01000100u) | ((w << 1) & 0x80008000u);
  }
}

template <bool NV>
struct FmtFP4 {  // MXFP4 (E8M0 per 32: one scale per lane) and NVFP4 (E4M3 per 16: two per lane)
  static constexpr int E = 32, KB = MMA_CHUNK_K_NVFP4, META = NV ? 8 : 4, META2 = 0, BIAS = 126;
  static_assert(MMA_CHUNK_K_NVFP4 == MMA_CHUNK_K_MXFP4, "one FP4 chunk");
  static constexpr bool ACC = false;
  struct S {
    uint32_t mul[2];
  };
  __device__ static S scale(const uint8_t* m, const uint8_t*, int t, const uint4&, float mul) {
    if constexpr (NV) {
      const uint16_t two = *reinterpret_cast<const uint16_t*>(m + 2 * t);
      return {{splat_bf16(e4m3_to_float(two & 0xFFu) * mul), splat_bf16(e4m3_to_float(two >> 8) * mul)}};
    } else {
      const uint32_t v = splat_bf16(e8m0_to_float(m[t]) * mul);
      return {{v, v}};
    }
  }
  template <int G>
  __device__ static void decode8(const uint4& q, const S& s, const uint32_t*, int, uint32_t (&a)[4]) {
    const uint32_t w = word(q, G), m = s.mul[G >> 1];
    a[0] = bmul(e2m1_pair<0>(w), m);
    a[1] = bmul(e2m1_pair<1>(w), m);
    a[2] = bmul(e2m1_pair<2>(w), m);
    a[3] = bmul(e2m1_pair<3>(w), m);
  }
};

struct FmtQ8_0 {  // int8 codes stored offset-binary (q + 128); fp16 d per 32 (two per row and chunk)
  static constexpr int E = 16, KB = MMA_CHUNK_K_Q8_0, META = 4, META2 = 0, BIAS = 0;
  static constexpr bool ACC = false;
  struct S {
    float d;
  };
  __device__ static S scale(const uint8_t* m, const uint8_t*, int t, const uint4&, float) {
    return {__half2float(reinterpret_cast<const __half*>(m)[t >> 1])};
  }
  // 2^23 + u as a float is exact for a byte u, so (that - 2^23 - 128) is q exactly; q·d is exact in fp32.
  __device__ static float q8(uint32_t w, int byte) {
    return __int_as_float(prmt(w, 0x4B000000u, 0x7440u | byte)) - 8388736.0f;
  }
  template <int G>
  __device__ static void decode8(const uint4& q, const S& s, const uint32_t*, int, uint32_t (&a)[4]) {
    const uint32_t w0 = word(q, 2 * G), w1 = word(q, 2 * G + 1);
    a[0] = pack_bf16(q8(w0, 0) * s.d, q8(w0, 1) * s.d);
    a[1] = pack_bf16(q8(w0, 2) * s.d, q8(w0, 3) * s.d);
    a[2] = pack_bf16(q8(w1, 0) * s.d, q8(w1, 1) * s.d);
    a[3] = pack_bf16(q8(w1, 2) * s.d, q8(w1, 3) * s.d);
  }
};

// IQ2: one 256-weight block per row and chunk; lane t holds weights 64t..64t+63 (8 groups of 8).
// A group's 8 grid values {8, 25, 43} with their signs, times the sub-block factor (0.5+s)/4, come out of two PRMTs
// over a 6-entry byte table (selector nibble = grid code 0..2, plus 4 when negative) that already holds the three
// products as bf16 bytes (iq2_scaled: two bf16x2 multiplies, each product rounded once, as multiplying every weight
// rounded it; the negatives differ in the sign bit only), so a group needs no multiply. decode8 asks for a sub-block's
// table in each of its groups; the compiler builds it once a sub-block (a pure computation, common to them), which
// also leaves it room to rebuild rather than hold it where registers are scarce (wgmma's 64-token tile). The
// grid-code word and the sign word of a group are read from shared-memory tables replicated kReplicas times across
// the banks, so the warp's 32 random lookups conflict at most two-way. The block's fp16 d multiplies the chunk's
// fp32 partial sums (ACC: the whole chunk is one block of the row).
// The grid's three values (the host checks them against b12x_formats' grids when it builds the tables) as bf16x2:
constexpr uint32_t kGrid01 = 0x41C84100u;  // bf16 (8, 25)
constexpr uint32_t kGrid2 = 0x0000422Cu;   // bf16 (43, 0)

struct Iq2Scaled {  // the grid's values times one sub-block factor: bf16 low bytes, high bytes, negated high bytes
  uint32_t lo, hi, hi_neg;
};
// The byte tables of three bf16 values: v01 = (value of grid 8, of 25) as bf16x2, v2 = (value of 43, anything).
__device__ __forceinline__ Iq2Scaled iq2_table(uint32_t v01, uint32_t v2) {
  const uint32_t hi = prmt(v01, v2, 0x1531u);
  return {prmt(v01, v2, 0x0420u), hi, hi ^ 0x00808080u};
}
__device__ __forceinline__ Iq2Scaled iq2_scaled(uint32_t mul) {  // mul: the factor as a bf16 splat
  return iq2_table(bmul(kGrid01, mul), bmul(kGrid2, mul));  // bytes 0-3: 8f, 25f; bytes 4-5: 43f
}
__device__ __forceinline__ void iq2_values(uint32_t sel, const Iq2Scaled& g, uint32_t (&a)[4]) {
  uint32_t lo = prmt(g.lo, g.lo, sel), hi = prmt(g.hi, g.hi_neg, sel);
  a[0] = prmt(lo, hi, 0x5140u);
  a[1] = prmt(lo, hi, 0x7362u);
  lo = prmt(g.lo, g.lo, sel >> 16);
  hi = prmt(g.hi, g.hi_neg, sel >> 16);
  a[2] = prmt(lo, hi, 0x5140u);
  a[3] = prmt(lo, hi, 0x7362u);
}

template <bool XS>
struct FmtIQ2 {
  static constexpr int E = 64, KB = XS ? MMA_CHUNK_K_IQ2_XS : MMA_CHUNK_K_IQ2_XXS, META = 2, META2 = XS ? 8 : 0;
  static constexpr int BIAS = 0;  // the grid's values themselves
  static constexpr bool ACC = true;
  static constexpr int GRID = XS ? IQ2_XS_GRID_ENTRIES : IQ2_XXS_GRID_ENTRIES;  // the 128 sign words follow
  // Sub-block factors of a lane's 64 weights: IQ2_XS one a 16 (four nibbles), IQ2_XXS one a 32 (sub-blocks 2t, 2t+1).
  static constexpr int SUBS = XS ? 4 : 2;
  struct S {
    uint32_t mul[SUBS];  // each factor as a bf16 splat
  };
  __device__ static S scale(const uint8_t*, const uint8_t* m2, int t, const uint4& q, float) {
    S s;
    if constexpr (XS) {
      const uint16_t two = *reinterpret_cast<const uint16_t*>(m2 + 2 * t);
#pragma unroll
      for (int h = 0; h < 4; ++h) s.mul[h] = splat_bf16(0.125f + 0.25f * float((two >> (4 * h)) & 15u));
    } else {
      s.mul[0] = splat_bf16(0.125f + 0.25f * float(q.y >> 28));
      s.mul[1] = splat_bf16(0.125f + 0.25f * float(q.w >> 28));
    }
    return s;
  }
  __device__ static float acc_scale(const uint8_t* m) { return __half2float(*reinterpret_cast<const __half*>(m)); }
  // A group's grid and sign words, addressed from this lane's replica: word i of a table sits i·kReplicas words in
  // (byte offset i << kReplicaShift: 6 at 16 replicas), and the sign table GRID·kReplicas words further (an
  // immediate of the load). A field at the word's top needs no mask.
  // Group G's grid index and sign index from the lane's 16 code bytes.
  template <int G>
  __device__ static void group_indices(const uint4& q, uint32_t& grid_idx, uint32_t& sign_idx) {
    if constexpr (XS) {  // a 16-bit half per group: grid index in bits 0-8, sign index in bits 9-15
      const uint32_t w = word(q, G >> 1);
      if constexpr (G & 1) {
        grid_idx = (w >> 16) & 511u;
        sign_idx = w >> 25;
      } else {
        grid_idx = w & 511u;
        sign_idx = (w >> 9) & 127u;
      }
    } else {  // four 8-bit grid indices in one word, four 7-bit sign indices in the next
      const uint32_t gw = word(q, 2 * (G >> 2)), sw = word(q, 2 * (G >> 2) + 1);
      grid_idx = (G & 3) == 3 ? gw >> 24 : (gw >> (8 * (G & 3))) & 255u;
      sign_idx = (sw >> (7 * (G & 3))) & 127u;
    }
  }
  template <int G>
  __device__ static void decode8(const uint4& q, const S& s, const uint32_t* tab, int lane, uint32_t (&a)[4]) {
    uint32_t grid_idx, sign_idx;
    group_indices<G>(q, grid_idx, sign_idx);
    const uint32_t lane_tab = static_cast<uint32_t>(__cvta_generic_to_shared(tab)) + 4u * (lane % kReplicas);
    const uint32_t sel =
        ld_shared(lane_tab + (grid_idx << kReplicaShift)) |
        ld_shared_at<GRID * kReplicas * 4>(lane_tab + (sign_idx << kReplicaShift));
    iq2_values(sel, iq2_scaled(s.mul[XS ? G >> 1 : G >> 2]), a);
  }
};

// ---------------------------------------------------------------------------------------------- kernel
template <class F>
constexpr int stage_chunks() {  // chunks per activation stage (>= kStages - 1, see the group count below)
  return F::KB >= 256 ? 3 : 4;
}
// Activation rows in shared memory. A B-operand load (LDS.128) serves lanes (q, t): lanes t of one token read
// 16-byte pieces p = E/8·t + g of the chunk; for E > 16 those collide in banks (t and t+2 are 128 bytes
// apart for FP4, all four t for IQ2), so piece p is stored at p ^ ((p >> 3) & (E/16 - 1)), and each token row
// is padded by E bytes so the two tokens of one load phase use the other half of the banks.
template <class F>
constexpr int x_swizzle_mask() {
  return F::E / 16 - 1;
}
template <class F>
constexpr int x_row_elems() {
  return stage_chunks<F>() * F::KB + F::E / 2;
}
template <class F>
constexpr int table_words() {
  if constexpr (F::E == 64) return (F::GRID + 128) * kReplicas;
  return 0;
}
// IQ2's grid and sign words into shared memory, replica r of word i at i * kReplicas + r (a splat 16-byte piece
// per 4 replicas). Every thread's loads go out before its first store, so the fill waits one memory latency rather
// than one a word (a store after each load was the hottest instruction at one token, the STS waiting on its __ldg:
// tools/kernel_profile.sh's NCU_SOURCE page), and a warp's stores are consecutive pieces (no bank conflict). The kernels call it after the weights'
// first copies are issued; their first chunk's barrier publishes the tables.
template <class F, int THREADS>
__device__ __forceinline__ void fill_tables(uint32_t* tab, const uint32_t* words) {
  constexpr int PIECES = table_words<F>() / 4, EACH = (PIECES + THREADS - 1) / THREADS;
  static_assert(kReplicas % 4 == 0, "whole pieces a word");
  uint32_t v[EACH];
#pragma unroll
  for (int k = 0; k < EACH; ++k) {
    const int piece = threadIdx.x + k * THREADS;
    v[k] = piece < PIECES ? __ldg(words + piece / (kReplicas / 4)) : 0u;
  }
#pragma unroll
  for (int k = 0; k < EACH; ++k) {
    const int piece = threadIdx.x + k * THREADS;
    if (piece < PIECES) reinterpret_cast<uint4*>(tab)[piece] = make_uint4(v[k], v[k], v[k], v[k]);
  }
}
template <class F>
constexpr int slot_bytes() {  // one chunk of a warp: 1 KB of codes, then its 16 rows' scale bytes
  return 1024 + 16 * F::META + 16 * F::META2 + (F::ACC && F::E != 64 ? 16 : 0);
}
template <class F, int MT, int TILES = kWarps>
constexpr int smem_bytes() {
  return table_words<F>() * 4 + 2 * (8 * MT) * x_row_elems<F>() * 2 + TILES * kStages * slot_bytes<F>();
}
// The register cap (__launch_bounds__' CTAs an SM): as many CTAs as the SM's shared memory holds, at most 4. SM90 holds
// 227 KB a block (at least 2 asked: measured so); SM12x (sm_120a / sm_121a passes) 100 KB an SM, where most of these
// CTAs fit once: asking for two there capped registers for CTAs that never run together (FP8_BLOCK at 32-token tiles
// spilled under it), so there the floor is 1.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
constexpr int kSmemPerSm = 100 * 1024, kMinBlocksFloor = 1;
#else
constexpr int kSmemPerSm = 227 * 1024, kMinBlocksFloor = 2;
#endif
template <class F, int MT, int TILES = kWarps>
constexpr int min_blocks() {
  constexpr int fit = kSmemPerSm / (smem_bytes<F, MT, TILES>() + 1024);
  return fit >= 4 ? 4 : fit > kMinBlocksFloor ? fit : kMinBlocksFloor;
}
// Resident activations (MmaArgs::resident; plans set it at one token, for FP8 and MXFP8 up to 8 tokens): a one-token
// tile's live rows (at most 8: dense, its tokens; grouped, its block's slots, at most min(M, 8) since M counts the
// slots) over the whole K range of its split, loaded once with the first weights, so the
// main loop has no CTA barrier a stage (the stage barrier was the one-token kernel's hottest stall in Nsight
// Compute: tools/kernel_profile.sh's NCU_SOURCE page). A row holds the split's chunks in the staged layout's swizzle (chunk-relative: KB/8 pieces a chunk
// keep the swizzle bits), padded by E/2 elements like a stage row.
template <class F>
__host__ __device__ constexpr int resident_row_elems(int chunks_per_split) {
  return chunks_per_split * F::KB + F::E / 2;
}
template <class F>
__host__ __device__ constexpr int resident_x_bytes(int M, int chunks_per_split) {
  return ((M < 8 ? M : 8) * resident_row_elems<F>(chunks_per_split) * 2 + 15) / 16 * 16;
}
template <class F>
__host__ __device__ constexpr int resident_smem_bytes(int M, int chunks_per_split, int tiles) {
  return table_words<F>() * 4 + resident_x_bytes<F>(M, chunks_per_split) + tiles * kStages * slot_bytes<F>();
}

// The activation modes a format's resident kernel quantizes its held rows to (MmaArgs::x_quant): those its plans pair
// it with (fp8 static: FP8; mxfp8: MXFP8, MXFP4, NVFP4; nvfp4: NVFP4). Each is a kernel instance of its own.
template <class F>
constexpr bool x_quantizes(int xq) {
  if (xq == MMA_XQ_FP8_STATIC) return std::is_same_v<F, FmtFP8>;
  if (xq == MMA_XQ_MXFP8)
    return std::is_same_v<F, FmtMXFP8> || std::is_same_v<F, FmtFP4<true>> || std::is_same_v<F, FmtFP4<false>>;
  if (xq == MMA_XQ_NVFP4) return std::is_same_v<F, FmtFP4<true>>;
  return xq == MMA_XQ_NONE;
}

// ---------------------------------------------------------------------------------------------- shared pieces
// What the tensor-core kernels share (this file's mma.sync kernel and wgmma_gemm.cu's warpgroup kernel): the token
// tile's rows, the per-warp weight copies, and the epilogue with its split-K reduction. Both kernels hold their
// accumulators in mma.sync's C layout per warp and 8-token group (wgmma's D fragment is that layout too).

// The token tile's rows into src_row / dst_row (shared, TOK each): input row (x) and output row (y / partials), −1
// past the tile's end. Returns the tile's expert (0 when not grouped), or −1 when the block table has nothing for
// this CTA (uniform over the CTA, so the caller returns before any barrier).
template <int TOK>
__device__ __forceinline__ int tile_rows(const MmaParams& p, int mtile, int* src_row, int* dst_row) {
  int expert = 0;
  if (p.order) {
    expert = p.block_expert[mtile];
    if (expert < 0) return -1;
  }
  if (threadIdx.x < TOK) {
    const int r = threadIdx.x;
    int src = -1, dst = -1;
    if (p.order) {
      if (r < p.block_rows[mtile]) {
        dst = p.order[p.block_start[mtile] + r];
        src = p.top_k ? dst / p.top_k : dst;
      }
    } else if (mtile * TOK + r < p.M) {
      src = dst = mtile * TOK + r;
    }
    src_row[r] = src;
    dst_row[r] = dst;
  }
  __syncthreads();
  return expert;
}

// Routed in the kernel (MmaCall::ids, no table): CTA b finds block b of the expert-sorted block table itself, the
// same blocks moe_route's table holds (experts in order, each one's slots in slot order, cut into blocks of TOK), and
// writes its rows into src_row / dst_row (−1 past the block's slots) and their count into *live. Returns the block's
// expert, or −1 past the routing's work (uniform). `scratch` is dynamic shared memory nothing else uses yet
// (route_scratch_bytes: the counts per expert and the ids). Every thread calls it (barriers). Costs a few
// shared-memory passes over ≤ 1024 slots, where the table would take a launch of its own before the GEMM
// (benchmarks/moe.py times both: tensor_core_moe and its "@unfused" form).
constexpr int kRouteMaxSlots = MMA_ROUTE_MAX_SLOTS, kRouteMaxExperts = MMA_ROUTE_MAX_EXPERTS;
constexpr int route_scratch_bytes() { return 4 * (kRouteMaxSlots + kRouteMaxExperts); }
template <int TOK, int THREADS>
__device__ __forceinline__ int route_rows(const MmaParams& p, int b, int* scratch, int* src_row, int* dst_row,
                                          int* live) {
  constexpr int WARPS = THREADS / 32;
  static_assert(THREADS % 32 == 0 && THREADS >= TOK, "whole warps; a thread per row of the block");
  __shared__ int warp_sum[WARPS], found[3];  // found: the block's expert, its index in the expert, the expert's slots
  int* count = scratch;                      // [experts]
  int* ids = scratch + kRouteMaxExperts;     // [slots]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, E = p.experts, S = p.M;
  for (int e = threadIdx.x; e < E; e += THREADS) count[e] = 0;
  if (threadIdx.x < TOK) src_row[threadIdx.x] = dst_row[threadIdx.x] = -1;
  if (threadIdx.x == 0) found[0] = -1;
  __syncthreads();
  for (int i = threadIdx.x; i < S; i += THREADS) {  // ids outside 0..E-1 are no expert's (the table drops them too)
    const int e = __ldg(p.ids + i);
    ids[i] = e;
    if (e >= 0 && e < E) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  // Blocks per expert, scanned: thread i owns experts [i·per, (i+1)·per); the one whose run holds block b names it.
  const int per = (E + THREADS - 1) / THREADS, e0 = min(E, threadIdx.x * per), e1 = min(E, e0 + per);
  int mine = 0;
  for (int e = e0; e < e1; ++e) mine += (count[e] + TOK - 1) / TOK;
  int incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_sum[warp] = incl;
  __syncthreads();
  for (int w = 0; w < warp; ++w) incl += warp_sum[w];
  if (b >= incl - mine && b < incl) {
    int first = incl - mine;
    for (int e = e0; e < e1; ++e) {
      const int blocks = (count[e] + TOK - 1) / TOK;
      if (b < first + blocks) {
        found[0] = e;
        found[1] = b - first;
        found[2] = count[e];
        break;
      }
      first += blocks;
    }
  }
  __syncthreads();
  const int expert = found[0];
  if (expert < 0) return -1;
  // The expert's slots in slot order (stable): a slot's rank is how many of the expert's slots come before it.
  const int lo = found[1] * TOK;
  int before = 0;
  for (int i0 = 0; i0 < S; i0 += THREADS) {
    const int i = i0 + threadIdx.x;
    const bool hit = i < S && ids[i] == expert;
    const unsigned m = __ballot_sync(0xffffffffu, hit);
    __syncthreads();  // the last round's warp_sum reads are done
    if (lane == 0) warp_sum[warp] = __popc(m);
    __syncthreads();
    int rank = before + __popc(m & ((1u << lane) - 1u));
    for (int w = 0; w < WARPS; ++w) {
      if (w < warp) rank += warp_sum[w];
      before += warp_sum[w];
    }
    const int r = rank - lo;
    if (hit && r >= 0 && r < TOK) {
      dst_row[r] = i;
      src_row[r] = p.top_k ? i / p.top_k : i;
    }
  }
  *live = min(TOK, found[2] - lo);  // every thread the same
  __syncthreads();
  return expert;
}

// The fused MoE's combine in the down GEMM (MmaCall::combine_w, MMA_OUT_F32): every CTA of output tile `nblk` (rows
// n0 .. n0 + width − 1), idle ones included, takes a ticket once its float32 slot rows are written; the last sums the
// tile's columns for every token, y[t, n] = bf16(Σ_j w[t, j] · Σ_s partials[s, t·k + j, n]), j and s in order (as
// b12x_kernels.tiles.moe_combine: deterministic, no atomics on data), and resets the ticket. Every thread calls it.
template <int THREADS>
__device__ __forceinline__ void combine_tile(const MmaParams& p, int nblk, int n0, int width) {
  __threadfence();
  __syncthreads();
  __shared__ int last;
  int* ticket = p.tickets + nblk;
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1) == int(gridDim.x * gridDim.y) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int k = p.combine_k, tokens = p.M / k, cols = min(width, p.N - n0);
  for (int i = threadIdx.x; i < tokens * cols; i += THREADS) {
    const int t = i / cols, n = n0 + i % cols;
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
      const int slot = t * k + j;
      float row = 0.f;
      for (int s = 0; s < p.splits; ++s) row += __ldcg(p.partials + (size_t(s) * p.M + slot) * p.N + n);
      acc += __ldg(p.combine_w + slot) * row;
    }
    p.y[size_t(t) * p.N + n] = __float2bfloat16_rn(acc);  // y: [tokens, N] contiguous
  }
  if (threadIdx.x == 0) *ticket = 0;  // ready for the next call (graph replays included)
}

// One warp's weight copies: chunk c of its RT row tiles (from tile_base) into ring slot (c % STAGES, tile r) by
// cp.async — the lane's two 16-byte code pieces (halves 0 and 1 of the tile), and lanes 0.. / 16.. copy the tile's
// scale bytes (16 rows × META / META2). The tile pointers advance by one tile per chunk.
template <class F, int RT>
struct WeightStream {
  static constexpr int SLOT = slot_bytes<F>();
  const uint4* code_base;
  const uint8_t* meta_base;
  const uint8_t* meta2_base;
  int tile_global, live;  // live: the warp's row tiles inside the weight

  __device__ WeightStream(const MmaParams& p, int tile_global_, int tile_base, int lane)
      : code_base(reinterpret_cast<const uint4*>(p.codes) + size_t(tile_global_) * p.chunks * 64 + lane),
        meta_base(p.meta + size_t(tile_global_) * p.chunks * 16 * F::META + 16 * lane),
        meta2_base(p.meta2 + size_t(tile_global_) * p.chunks * 16 * F::META2 + 16 * (lane - 16)),
        tile_global(tile_global_),
        live(min(RT, p.n16 - tile_base)) {}

  template <int STAGES>
  __device__ __forceinline__ void copy(const MmaParams& p, uint8_t* ring, int c, int lane) const {
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      if (r >= live) break;
      const size_t tile = size_t(r) * p.chunks + c;  // relative to tile_base
      uint8_t* slot = ring + ((unsigned(c) % STAGES) * RT + r) * SLOT;
      const uint4* codes = code_base + tile * 64;
      cp_async16(slot + 16 * lane, codes, 16);
      cp_async16(slot + 512 + 16 * lane, codes + 32, 16);
      if constexpr (F::META > 0) {
        if (lane < F::META) cp_async16(slot + 1024 + 16 * lane, meta_base + tile * 16 * F::META, 16);
      }
      if constexpr (F::META2 > 0) {
        if (lane >= 16 && lane < 16 + F::META2)
          cp_async16(slot + 1024 + 16 * F::META + 16 * (lane - 16), meta2_base + tile * 16 * F::META2, 16);
      }
      if constexpr (F::ACC && F::E != 64) {  // FP8_BLOCK: the chunk's block scale (uniform over the tile)
        if (lane == 0) {
          const int kblocks = (p.K + 127) / 128;
          const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(slot + 1024));
          asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s),
                       "l"(p.block_scale + size_t((tile_global + r) / 8) * kblocks + (c * F::KB) / 128));
        }
      }
    }
  }
};

// The epilogue of one warp's accumulators acc[r][j][e] (row tile tile_base + r, token group j; e as mma.sync's C:
// c0,c1 row q, tile columns 2t, 2t+1; c2,c3 row q+8): the argument block's output (MmaOut), through the split-K
// reduction when K is split (each split writes fp32 partials; the last CTA of an output tile, by an atomic ticket, sums
// them in split order — deterministic — and resets the ticket). Every thread of the CTA calls it (it has barriers).
template <int RT, int MT>
__device__ __forceinline__ void store_tile(const MmaParams& p, float (&acc)[RT][MT][4], int tile_base, int expert,
                                           int split, int mtile, int nblk, const int* dst_row) {
  const int lane = threadIdx.x & 31, q = lane >> 2, t = lane & 3;
  auto out_row = [&](int j, int e) { return dst_row[8 * j + 2 * t + (e & 1)]; };  // −1: none
  auto row = [&](int r, int e) { return (tile_base + r) * 16 + q + 8 * (e >> 1); };  // within the expert
  auto in_range = [&](int r, int j, int e) { return out_row(j, e) >= 0 && row(r, e) < p.N; };
  auto scaled = [&](int r, int e, float v) {
    v *= p.alpha;
    return p.row_scale ? v * __ldg(p.row_scale + size_t(expert) * p.N + row(r, e)) : v;
  };
  auto part_index = [&](int s, int r, int j, int e) {
    return (size_t(s) * p.M + out_row(j, e)) * p.N + row(r, e);
  };
  // v: the four (split-summed) accumulators of row tile r, token group j.
  auto finish = [&](int r, int j, const float (&v)[4]) {
    if (p.epilogue == MMA_OUT_SILU) {  // gate rows q (c0, c1) pair with up rows q + 8 (c2, c3)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (!in_range(r, j, e)) continue;
        const float g = scaled(r, e, v[e]), u = scaled(r, e + 2, v[e + 2]);
        const float h = g / (1.f + __expf(-g)) * u;
        p.y[size_t(out_row(j, e)) * p.ldy + (tile_base + r) * 8 + q] = __float2bfloat16_rn(h);
      }
      return;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (!in_range(r, j, e)) continue;
      const int n = row(r, e);
      float x = scaled(r, e, v[e]);
      if (p.epilogue == MMA_OUT_RELU2) {
        x = fmaxf(x, 0.f);
        x *= x;
      } else if (p.bias) {
        x += __bfloat162float(p.bias[n]);
      }
      p.y[size_t(out_row(j, e)) * p.ldy + n] = __float2bfloat16_rn(x);
    }
  };
  if (p.epilogue == MMA_OUT_F32) {  // each split its own slab: the consumer sums them in order
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (in_range(r, j, e)) p.partials[part_index(split, r, j, e)] = scaled(r, e, acc[r][j][e]);
    return;
  }
  if (p.splits == 1) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int j = 0; j < MT; ++j) finish(r, j, acc[r][j]);
    return;
  }
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (in_range(r, j, e)) p.partials[part_index(split, r, j, e)] = acc[r][j][e];
  __threadfence();
  __syncthreads();
  __shared__ int last;
  int* ticket = p.tickets + size_t(nblk) * gridDim.x + mtile;
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1) == p.splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The sums, in split order (deterministic). The loads of SB splits × JB token groups of the thread's accumulators
  // are issued before any of them is added: a loop over the splits inside each accumulator's waited one L2 round
  // trip per accumulator and split, and the last CTA of an output tile held its SM that long (tens of µs at 128
  // tokens in Nsight Compute). At most 32 loads in flight a thread: more spill where the launch bounds cap the
  // registers (the one-token tiles). acc is dead here (its values are in the partials), so only the sums of one block
  // of token groups are live.
  constexpr int JB = RT * MT * 4 <= 32 ? MT : 32 / (RT * 4);
  constexpr int SB = 32 / (RT * JB * 4) > 0 ? 32 / (RT * JB * 4) : 1;
  static_assert(MT % JB == 0, "whole blocks of token groups");
#pragma unroll
  for (int j0 = 0; j0 < MT; j0 += JB) {
    float v[RT][JB][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int jj = 0; jj < JB; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) v[r][jj][e] = 0.f;
    for (int s0 = 0; s0 < p.splits; s0 += SB) {
      float part[RT][JB][4][SB];
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int jj = 0; jj < JB; ++jj)
#pragma unroll
          for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int b = 0; b < SB; ++b)
              part[r][jj][e][b] = s0 + b < p.splits && in_range(r, j0 + jj, e)
                                      ? __ldcg(p.partials + part_index(s0 + b, r, j0 + jj, e))
                                      : 0.f;
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int jj = 0; jj < JB; ++jj)
#pragma unroll
          for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int b = 0; b < SB; ++b)
              if (s0 + b < p.splits) v[r][jj][e] += part[r][jj][e][b];
    }
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int jj = 0; jj < JB; ++jj) finish(r, j0 + jj, v[r][jj]);
  }
  if (threadIdx.x == 0) *ticket = 0;  // ready for the next call (graph replays included)
}

// A CTA covers TILES row tiles of 16 weight rows (128 rows) and one token tile; RT row tiles per warp (TILES/RT
// warps) let each B operand loaded from shared memory feed RT tiles' MMAs. Grouped (p.order set): the token tile is one
// block of the expert-sorted block table and the weight rows are its expert's (kernels.h MmaArgs).
// XQ (resident only; MmaXQuant): the held rows are quantized as they are loaded (quantize_pieces).
template <class F, int MT, int RT, int TILES = kWarps, bool RX = false, int XQ = MMA_XQ_NONE>
__global__ void __launch_bounds__(32 * TILES / RT, min_blocks<F, MT, TILES>()) mma_gemm_kernel(const MmaParams p) {
  extern __shared__ __align__(16) uint32_t smem[];
  constexpr int WARPS = TILES / RT, THREADS = 32 * WARPS;
  static_assert(TILES % RT == 0 && THREADS >= 8 * MT, "whole warps; a thread per token of the tile");
  constexpr int TOK = 8 * MT, XC = stage_chunks<F>(), XROW = x_row_elems<F>(), XSTAGE = TOK * XROW;
  constexpr int SLOT = slot_bytes<F>();
  static_assert(XC >= kStages - 1, "an activation stage must be complete when its first chunk is");
  static_assert(!RX || (MT == 1 && RT == 1), "resident activations: one-token tiles of one row tile a warp");
  static_assert(XQ == MMA_XQ_NONE || RX, "activations are quantized where they are held");
  static_assert(F::KB / 64 % (x_swizzle_mask<F>() + 1) == 0, "the swizzle bits repeat every chunk");
  uint32_t* tab = smem;
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem + table_words<F>());
  // Resident: the split's activations, one row of XR elements a live token (resident_x_bytes); staged: two stages.
  const int XR = RX ? resident_row_elems<F>(p.chunks_per_split) : XROW;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane >> 2, t = lane & 3;
  const int mtile = blockIdx.x, split = blockIdx.y, nblk = blockIdx.z;
  const int c_begin = split * p.chunks_per_split;
  const int c_end = min(p.chunks, c_begin + p.chunks_per_split);
  const int tile_base = (nblk * WARPS + warp) * RT;  // this warp's row tiles: tile_base .. tile_base + RT - 1
  const bool rows_live = tile_base < p.n16;
  uint8_t* ring;
  if constexpr (RX) {
    ring = reinterpret_cast<uint8_t*>(xs) + resident_x_bytes<F>(p.M, p.chunks_per_split) + warp * kStages * RT * SLOT;
  } else {
    ring = reinterpret_cast<uint8_t*>(xs + 2 * XSTAGE) + warp * kStages * RT * SLOT;
  }

  // The first kStages - 1 chunks of weights (cp.async, committed below with the activations as the first group).
  auto issue_first = [&](const WeightStream<F, RT>& ws) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s)
      if (c_begin + s < c_end) ws.template copy<kStages>(p, ring, c_begin + s, lane);
  };
  // Dense, the weight rows are known before the previous kernel ends: their first copies go out before the wait
  // (launch.cuh); grouped, the block table names the expert, so they wait for the kernel that wrote it.
  const bool grouped = p.grouped();
  if (!grouped) issue_first(WeightStream<F, RT>(p, tile_base, tile_base, lane));
  if constexpr (table_words<F>() > 0) fill_tables<F, THREADS>(tab, p.tables);  // constant: before the wait too
  grid_dependency_wait();

  __shared__ int src_row[TOK], dst_row[TOK];
  // Routed here: the scratch is the activation and weight rings, which nothing has written yet when grouped.
  static_assert(TILES * kStages * slot_bytes<F>() >= route_scratch_bytes(), "the routing scratch fits the ring");
  int block_live = 0;
  const int expert = p.ids
                         ? route_rows<TOK, THREADS>(p, mtile, reinterpret_cast<int*>(xs), src_row, dst_row, &block_live)
                         : tile_rows<TOK>(p, mtile, src_row, dst_row);
  if (expert < 0) {  // past the routing's work (uniform over the CTA): the launch size is fixed
    if (p.combine_w) combine_tile<THREADS>(p, nblk, nblk * TILES * 16, TILES * 16);
    return;
  }
  const int tile_global = expert * p.n16 + tile_base;  // in the stacked weight

  // Activation rows from chunk c0 on, `pieces` 16-byte cp.async pieces a row, in the swizzle the fragments read,
  // zero-filled past M, K and the split. Staged: a stage of TOK rows and XC chunks; resident: the live rows of
  // the whole split (chunk-relative swizzle, see resident_row_elems).
  auto load_rows = [&](__nv_bfloat16* dst, int row_stride, int rows, int pieces, int c0) {
    const int k_end = min(p.K, c_end * F::KB);
    if constexpr (XQ != MMA_XQ_NONE) {  // a thread a scale group: read, quantized, stored (the first barrier publishes)
      constexpr int G = xq_pieces(XQ);
      static_assert(F::KB % (8 * G) == 0, "chunks (and so splits) start on a scale group");
      const int units = pieces / G;
      for (int i = threadIdx.x; i < rows * units; i += THREADS) {
        const int r = i / units, pc0 = i % units * G, m = src_row[r];
        uint4 v[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {  // zero past M, K and the split, as the operand pass pads a last group
          const int k = c0 * F::KB + (pc0 + g) * 8;
          const bool ok = m >= 0 && k < k_end;
          v[g] = ok ? *reinterpret_cast<const uint4*>(p.x + size_t(m) * p.K + k) : make_uint4(0u, 0u, 0u, 0u);
        }
        quantize_pieces<XQ, G>(v, p.x_quant_scale);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const int pc = pc0 + g, phys = pc ^ ((pc >> 3) & x_swizzle_mask<F>());
          *reinterpret_cast<uint4*>(dst + r * row_stride + phys * 8) = v[g];
        }
      }
    } else {
      for (int i = threadIdx.x; i < rows * pieces; i += THREADS) {
        const int r = i / pieces, pc = i % pieces;
        const int m = src_row[r], k = c0 * F::KB + pc * 8;
        const bool ok = m >= 0 && k < k_end;
        const int phys = pc ^ ((pc >> 3) & x_swizzle_mask<F>());
        cp_async16(dst + r * row_stride + phys * 8, ok ? p.x + size_t(m) * p.K + k : p.x, ok ? 16 : 0);
      }
    }
  };
  auto load_stage = [&](int c0, int buf) { load_rows(xs + buf * XSTAGE, XROW, TOK, XC * F::KB / 8, c0); };
  // Held rows: dense, the tile's tokens below M; grouped, the block's slots (a block's live rows come first).
  const int live_rows =
      !RX ? TOK : min(TOK, p.ids ? block_live : grouped ? p.block_rows[mtile] : p.M - mtile * TOK);

  static_assert((kStages & (kStages - 1)) == 0, "ring slots are chunk & (kStages - 1)");
  const WeightStream<F, RT> weights(p, tile_global, tile_base, lane);
  auto issue = [&](int c) {
    if (c < c_end) weights.template copy<kStages>(p, ring, c, lane);
  };
  if (grouped) issue_first(weights);

  float acc[RT][MT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[r][j][0] = acc[r][j][1] = acc[r][j][2] = acc[r][j][3] = 0.f;

  // cp.async groups, one committed per chunk in order: group g holds chunk g's weights (and, for the first
  // chunk of stage s, the activations of stage s+1). Waiting until kStages-2 groups remain before chunk i's
  // commit completes group i; stage s+1's activations (group first(s) + kStages-1) are then complete by
  // first(s+1) = first(s) + XC because XC >= kStages - 1. The first group holds the first kStages - 1 chunks
  // (issued above) and the first stage's activations; the next kStages - 2 are empty.
  if (c_begin < c_end) {
    if constexpr (RX) {
      load_rows(xs, XR, live_rows, (c_end - c_begin) * (F::KB / 8), c_begin);
    } else {
      load_stage(c_begin, 0);
    }
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) cp_async_commit();
  // This lane's pieces E/8·t + g sit at g ^ (swizzle of t) within its E/8: offsets per g & mask, in elements.
  constexpr int SW = x_swizzle_mask<F>();
  int xoff[SW + 1];
#pragma unroll
  for (int r = 0; r <= SW; ++r) xoff[r] = ((r ^ ((F::E / 8 * t >> 3) & SW)) - r) * 8;
  int buf = 0;
  // Resident: rows past the tile's tokens are not held. Their lanes read row 0 instead: a token's B column reaches
  // only its own D column, and store_tile stores no column of a token past M (dst_row −1), so no select is needed.
  const int q_held = RX && q >= live_rows ? 0 : q;
  for (int base = c_begin; base < c_end; base += XC) {
    const __nv_bfloat16* xrow = RX ? xs + q_held * XR + (base - c_begin) * F::KB + F::E * t
                                   : xs + buf * XSTAGE + q * XROW + F::E * t;
    static_for<XC>([&](auto U) {
      constexpr int u = decltype(U)::value;
      const int c = base + u;
      if (c < c_end) {  // uniform over the CTA
        cp_async_wait<kStages - 2>();
        if (u == 0 && (!RX || base == c_begin)) {  // resident: once, when every row has landed
          __syncthreads();  // this stage's activations are visible; every warp is done with the last one
          if constexpr (!RX) {
            if (base + XC < c_end) load_stage(base + XC, buf ^ 1);
          }
        }
        __syncwarp();  // the scale bytes other lanes copied are visible; slot c-1 is free
        issue(c + kStages - 1);
        cp_async_commit();
        if (rows_live) {
          uint4 w[RT][2];
          typename F::S sc[RT][2];
          float part[RT][MT][4];
#pragma unroll
          for (int r = 0; r < RT; ++r) {
            const uint8_t* slot = ring + ((c & (kStages - 1)) * RT + r) * SLOT;
            w[r][0] = *reinterpret_cast<const uint4*>(slot + 16 * lane);
            w[r][1] = *reinterpret_cast<const uint4*>(slot + 512 + 16 * lane);
            const uint8_t* m = slot + 1024;
            const uint8_t* m2 = slot + 1024 + 16 * F::META;
            sc[r][0] = F::scale(m + q * F::META, m2 + q * F::META2, t, w[r][0], p.scale_mul);
            sc[r][1] = F::scale(m + (8 + q) * F::META, m2 + (8 + q) * F::META2, t, w[r][1], p.scale_mul);
#pragma unroll
            for (int j = 0; j < MT; ++j) part[r][j][0] = part[r][j][1] = part[r][j][2] = part[r][j][3] = 0.f;
          }
          float(&target)[RT][MT][4] = F::ACC ? part : acc;
          static_for<F::E / 8>([&](auto G) {
            constexpr int g = decltype(G)::value;
            uint32_t ar[RT][4], ar8[RT][4];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
              F::template decode8<g>(w[r][0], sc[r][0], tab, lane, ar[r]);
              F::template decode8<g>(w[r][1], sc[r][1], tab, lane, ar8[r]);
            }
#pragma unroll
            for (int j = 0; j < MT; ++j) {
              const uint4* bp = reinterpret_cast<const uint4*>(xrow + 8 * j * XROW + u * F::KB + 8 * g + xoff[g & SW]);
              const uint4 b = *bp;
#pragma unroll
              for (int r = 0; r < RT; ++r) {
                mma16816(target[r][j], ar[r][0], ar8[r][0], ar[r][1], ar8[r][1], b.x, b.y);
                mma16816(target[r][j], ar[r][2], ar8[r][2], ar[r][3], ar8[r][3], b.z, b.w);
              }
            }
          });
          if constexpr (F::ACC) {  // rows q and q+8: c0,c1 and c2,c3
#pragma unroll
            for (int r = 0; r < RT; ++r) {
              const uint8_t* m = ring + ((c & (kStages - 1)) * RT + r) * SLOT + 1024;
              float s2[2];
              if constexpr (F::E == 64) {
                s2[0] = F::acc_scale(m + q * F::META);
                s2[1] = F::acc_scale(m + (8 + q) * F::META);
              } else {
                s2[0] = s2[1] = *reinterpret_cast<const float*>(m);
              }
#pragma unroll
              for (int j = 0; j < MT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[r][j][e] += s2[e >> 1] * part[r][j][e];
            }
          }
        }
      }
    });
    buf ^= 1;
  }
  cp_async_wait<0>();
  grid_dependents_launch();  // the next kernel may start its weight copies while this one stores

  store_tile<RT, MT>(p, acc, tile_base, expert, split, mtile, nblk, dst_row);
  if (p.combine_w) combine_tile<THREADS>(p, nblk, nblk * TILES * 16, TILES * 16);
}

template <class F, int MT, int RT, int TILES = kWarps, bool RX = false, int XQ = MMA_XQ_NONE>
cudaError_t launch(const MmaParams& p, int mtiles, int nblocks, cudaStream_t stream) {
  static_assert(smem_bytes<F, MT, TILES>() <= 227 * 1024, "shared memory of one CTA");
  const int bytes = RX ? resident_smem_bytes<F>(p.M, p.chunks_per_split, TILES) : smem_bytes<F, MT, TILES>();
  if (bytes > 227 * 1024) return cudaErrorInvalidValue;  // the host refuses it first (mma_resident_smem_bytes)
  auto kernel = mma_gemm_kernel<F, MT, RT, TILES, RX, XQ>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  return launch_kernel(p.pdl, kernel, dim3(mtiles, p.splits, nblocks), dim3(32 * TILES / RT), bytes, stream, p);
}

// fn(integral_constant MT, RT, TILES) for an argument block's (mt, rt, tiles): every token tile and row tiling at
// kWarps row tiles a CTA, and the one-token tile of one row tile a warp at 6 or 7 (mma_args_error names the
// combinations).
template <class R, class Fn>
R with_kernel(int mt, int rt, int tiles, R fallback, Fn&& fn) {
  using std::integral_constant;
  if (tiles != kWarps) {
    if (mt != 1 || rt != 1) return fallback;
    if (tiles == 7) return fn(integral_constant<int, 1>{}, integral_constant<int, 1>{}, integral_constant<int, 7>{});
    if (tiles == 6) return fn(integral_constant<int, 1>{}, integral_constant<int, 1>{}, integral_constant<int, 6>{});
    return fallback;
  }
  auto by_mt = [&](auto RT) -> R {
    switch (mt) {
      case 1: return fn(integral_constant<int, 1>{}, RT, integral_constant<int, kWarps>{});
      case 2: return fn(integral_constant<int, 2>{}, RT, integral_constant<int, kWarps>{});
      case 4: return fn(integral_constant<int, 4>{}, RT, integral_constant<int, kWarps>{});
      default: return fallback;
    }
  };
  return rt == 2 ? by_mt(integral_constant<int, 2>{}) : rt == 1 ? by_mt(integral_constant<int, 1>{}) : fallback;
}

template <class F>
cudaError_t launch_cfg(int mt, int rt, int tiles, const MmaParams& p, int nblocks, cudaStream_t stream) {
  const int mtiles = p.grouped() ? p.blocks : (p.M + 8 * mt - 1) / (8 * mt);  // grouped: a CTA a table block
  return with_kernel(mt, rt, tiles, cudaErrorInvalidValue, [&](auto MT, auto RT, auto TL) {
    constexpr int mt_ = decltype(MT)::value, rt_ = decltype(RT)::value, tl_ = decltype(TL)::value;
    if constexpr (mt_ == 1 && rt_ == 1) {  // resident activations (mma_args_error: only here), dense or grouped
      if (p.resident) {  // the activation modes this format's plans pair it with, quantized where held (x_quantizes)
        auto held = [&](auto XQ) {
          return launch<F, 1, 1, tl_, true, decltype(XQ)::value>(p, mtiles, nblocks, stream);
        };
        using std::integral_constant;
        if constexpr (x_quantizes<F>(MMA_XQ_FP8_STATIC)) {
          if (p.x_quant == MMA_XQ_FP8_STATIC) return held(integral_constant<int, MMA_XQ_FP8_STATIC>{});
        }
        if constexpr (x_quantizes<F>(MMA_XQ_MXFP8)) {
          if (p.x_quant == MMA_XQ_MXFP8) return held(integral_constant<int, MMA_XQ_MXFP8>{});
        }
        if constexpr (x_quantizes<F>(MMA_XQ_NVFP4)) {
          if (p.x_quant == MMA_XQ_NVFP4) return held(integral_constant<int, MMA_XQ_NVFP4>{});
        }
        if (p.x_quant != MMA_XQ_NONE) return cudaErrorInvalidValue;  // mma_args_error refuses it first
        return held(integral_constant<int, MMA_XQ_NONE>{});
      }
    }
    return launch<F, mt_, rt_, tl_>(p, mtiles, nblocks, stream);
  });
}

template <class F>
int blocks_per_sm_cfg(int mt, int rt, int tiles) {  // 0 where it cannot run here (launch.cuh blocks_per_sm_of)
  return with_kernel(mt, rt, tiles, 0, [&](auto MT, auto RT, auto TL) {
    constexpr int mt_ = decltype(MT)::value, rt_ = decltype(RT)::value, tl_ = decltype(TL)::value;
    return blocks_per_sm_of(mma_gemm_kernel<F, mt_, rt_, tl_>, 32 * tl_ / rt_, smem_bytes<F, mt_, tl_>());
  });
}

// Declares (`extern`) or instantiates (nothing) the kernels of decode functor F: mma_gemm.cu declares every
// format's, mma_gemm_<format>.cu instantiates its own, so the formats compile in parallel translation units.
#define B12X_MMA_KERNELS(PREFIX, F)                                                        \
  PREFIX template cudaError_t launch_cfg<F>(int, int, int, const MmaParams&, int, cudaStream_t); \
  PREFIX template int blocks_per_sm_cfg<F>(int, int, int);

// fn(F{}) for the decode functor F of a format number (FMT_*), or `fallback` for an unknown number: the one map
// from format numbers to functors (the GEMM's host entry points and the dequantize pass use it).
template <class R, class Fn>
R with_format(int format, R fallback, Fn&& fn) {
  switch (format) {
    case FMT_FP8: return fn(FmtFP8{});
    case FMT_FP8_BLOCK: return fn(FmtFP8Block{});
    case FMT_MXFP8: return fn(FmtMXFP8{});
    case FMT_NVFP4: return fn(FmtFP4<true>{});
    case FMT_MXFP4: return fn(FmtFP4<false>{});
    case FMT_Q8_0: return fn(FmtQ8_0{});
    case FMT_IQ2_XXS: return fn(FmtIQ2<false>{});
    case FMT_IQ2_XS: return fn(FmtIQ2<true>{});
    default: return fallback;
  }
}
template <class F>
constexpr bool is_iq2 = std::is_same_v<F, FmtIQ2<false>> || std::is_same_v<F, FmtIQ2<true>>;

}  // namespace mma
}  // namespace b12x
