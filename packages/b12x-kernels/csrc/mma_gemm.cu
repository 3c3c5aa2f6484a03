// Tensor-core mixed-input GEMM (Marlin class) for every b12x weight format with bf16-valued activations:
//   y[m, n] = alpha * sum_k x[m, k] * W[n, k] (+ bias[n])
//
// Why this shape (the GEMV and decode-to-bf16 paths it replaces could not beat bf16 above one token):
// - Weights are the MMA's A operand (m16 = 16 weight rows), tokens its B operand (n8 = 8 tokens), so a
//   decode-sized call pads tokens to 8, not to 16, and every weight byte is read once per token tile.
// - The weight is repacked at prepare time (b12x_core/mma_layout.py, lossless) into 1 KB tiles: 16 rows × one
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

namespace b12x {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kDepth = 4;  // weight chunks in flight per warp (register ring)

struct MmaParams {
  const uint4* codes;        // repacked code tiles
  const uint8_t* meta;       // per (row, chunk) scale bytes, row-blocked (see mma_layout.py)
  const uint8_t* meta2;      // IQ2_XS: its 8 sub-block scale bytes per (row, chunk)
  const float* block_scale;  // FP8_BLOCK: float32 [ceil(N/128), ceil(K/128)]
  const uint32_t* tables;    // IQ2: grid nibble codes [grid entries] then sign nibble masks [128]
  float alpha;
  float scale_mul;  // power of two applied to block scales (alpha carries its inverse)
  const __nv_bfloat16* x;
  const __nv_bfloat16* bias;
  __nv_bfloat16* y;
  int ldy, M, N, K, n16, chunks, chunks_per_split, splits;
  float* partials;  // [splits, M, N] fp32 (splits > 1)
  int* tickets;     // [m tiles, n blocks], zero at rest
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
// f(std::integral_constant<int, 0>) ... f(<N-1>): register arrays stay indexed by constants.
template <class Fn, int... I>
__device__ __forceinline__ void static_for_impl(Fn&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class Fn>
__device__ __forceinline__ void static_for(Fn&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}

// E4M3 byte pair -> bf16x2 bit patterns worth value·2^-120 (the exponent field moves from 4 to 8 bits
// unchanged, subnormals included). The repack puts a pair's two bytes at bytes (0, 2) or (1, 3) of a word.
__device__ __forceinline__ uint32_t e4m3_pair_lo(uint32_t w) {
  return ((w << 4) & 0x07F007F0u) | ((w << 8) & 0x80008000u);
}
__device__ __forceinline__ uint32_t e4m3_pair_hi(uint32_t w) {
  return ((w >> 4) & 0x07F007F0u) | (w & 0x80008000u);
}
// ---------------------------------------------------------------------------------------------- formats
// Each format says: E (elements of one row per lane per chunk), KB (K per chunk), META / META2 (scale bytes per
// row and chunk in `meta` / `meta2`), how a lane builds its per-chunk scale state S for one row from those bytes,
// decode8<G>: lane elements 8G..8G+7 of that row as four bf16x2 pairs (pair i = elements 8G+2i, 8G+2i+1), and
// ACC: whether a per-row fp32 factor multiplies the chunk's partial sums instead (acc_scale).
// `mul` (MmaParams::scale_mul) is the power of two that brings bit-pattern decodes into range: the host picks it
// so every block scale times it fits bf16, and folds its inverse into alpha.
struct FmtFP8 {  // per-tensor FP8 (scale in alpha)
  static constexpr int E = 16, KB = 64, META = 0, META2 = 0;
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

struct FmtMXFP8 : FmtFP8 {  // two E8M0 scales (32 weights each) per row and chunk; lane t uses scale t/2
  static constexpr int META = 2;
  __device__ static S scale(const uint8_t* m, const uint8_t*, int t, const uint4&, float mul) {
    return {splat_bf16(e8m0_to_float(m[t >> 1]) * mul)};
  }
};

// E2M1 pair p of a repacked word (mma_layout.py): the low element's magnitude at bits L..L+2 and the high
// one's at L+16.., L = 6, 3, 0, 9 for p = 0..3; their signs at bits 12+p and 28+p. Shifting the magnitudes to
// bits 6-8 / 22-24 and the signs to 15 / 31 makes bf16 bit patterns worth value·2^-126.
template <int P>
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t w) {
  constexpr int L[4] = {6, 3, 0, 9};
  const uint32_t mag = (L[P] <= 6 ? w << (6 - L[P]) : w >> (L[P] - 6)) & 0x01C001C0u;
  return mag | ((w << (3 - P)) & 0x80008000u);
}

template <bool NV>
struct FmtFP4 {  // MXFP4 (E8M0 per 32: one scale per lane) and NVFP4 (E4M3 per 16: two per lane)
  static constexpr int E = 32, KB = 128, META = NV ? 8 : 4, META2 = 0;
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
  static constexpr int E = 16, KB = 64, META = 4, META2 = 0;
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
// A group's 8 grid values {8, 25, 43} with their signs come out of two PRMTs over a 6-entry byte table
// (selector nibble = grid code 0..2, plus 4 when negative); the grid-code word and the sign word of a group
// are read from shared-memory tables replicated once per bank, so the warp's 32 random lookups never
// conflict. The sub-block factor (0.5+s)/4 multiplies in bf16 (exact; the product rounds once), the block's
// fp16 d multiplies the chunk's fp32 partial sums (ACC: the whole chunk is one block of the row).
constexpr uint32_t kLo0 = 0x002CC800u, kLo1 = 0x002CC800u;  // low bytes of bf16 8, 25, 43 (+ the same, -)
constexpr uint32_t kHi0 = 0x00424141u, kHi1 = 0x00C2C1C1u;  // high bytes: +8 +25 +43 | -8 -25 -43

__device__ __forceinline__ void iq2_values(uint32_t sel, uint32_t mul, uint32_t (&a)[4]) {
  uint32_t lo = prmt(kLo0, kLo1, sel), hi = prmt(kHi0, kHi1, sel);
  a[0] = bmul(prmt(lo, hi, 0x5140u), mul);
  a[1] = bmul(prmt(lo, hi, 0x7362u), mul);
  lo = prmt(kLo0, kLo1, sel >> 16);
  hi = prmt(kHi0, kHi1, sel >> 16);
  a[2] = bmul(prmt(lo, hi, 0x5140u), mul);
  a[3] = bmul(prmt(lo, hi, 0x7362u), mul);
}

template <bool XS>
struct FmtIQ2 {
  static constexpr int E = 64, KB = 256, META = 2, META2 = XS ? 8 : 0;
  static constexpr bool ACC = true;
  static constexpr int GRID = XS ? 512 : 256;  // grid entries; the sign table (128) follows in `tables`
  struct S {
    uint32_t mul[4];  // per 16 weights of the lane: IQ2_XXS sub-blocks 2t, 2t+1; IQ2_XS four nibbles
  };
  __device__ static S scale(const uint8_t*, const uint8_t* m2, int t, const uint4& q, float) {
    S s;
    if constexpr (XS) {
      const uint16_t two = *reinterpret_cast<const uint16_t*>(m2 + 2 * t);
#pragma unroll
      for (int h = 0; h < 4; ++h) s.mul[h] = splat_bf16(0.125f + 0.25f * float((two >> (4 * h)) & 15u));
    } else {
      s.mul[0] = s.mul[1] = splat_bf16(0.125f + 0.25f * float(q.y >> 28));
      s.mul[2] = s.mul[3] = splat_bf16(0.125f + 0.25f * float(q.w >> 28));
    }
    return s;
  }
  __device__ static float acc_scale(const uint8_t* m) { return __half2float(*reinterpret_cast<const __half*>(m)); }
  template <int G>
  __device__ static void decode8(const uint4& q, const S& s, const uint32_t* tab, int lane, uint32_t (&a)[4]) {
    uint32_t grid_idx, sign_idx;
    if constexpr (XS) {
      const uint32_t v = word(q, G >> 1) >> (16 * (G & 1));
      grid_idx = v & 511u;
      sign_idx = (v >> 9) & 127u;
    } else {
      grid_idx = (word(q, 2 * (G >> 2)) >> (8 * (G & 3))) & 255u;
      sign_idx = (word(q, 2 * (G >> 2) + 1) >> (7 * (G & 3))) & 127u;
    }
    const uint32_t sel = tab[grid_idx * 32 + lane] | tab[(GRID + sign_idx) * 32 + lane];
    iq2_values(sel, s.mul[G >> 1], a);
  }
};

// ---------------------------------------------------------------------------------------------- kernel
template <class F>
constexpr int stage_chunks() {  // chunks per activation stage: 512 k (1024 for IQ2)
  return F::KB >= 256 ? 4 : 512 / F::KB;
}
template <class F>
constexpr int x_row_elems() {
  return stage_chunks<F>() * F::KB + 8;  // +16 bytes per row: consecutive tokens start in other banks
}
template <class F>
constexpr int table_words() {
  if constexpr (F::E == 64) return (F::GRID + 128) * 32;
  return 0;
}

template <class F, int MT>
__global__ void __launch_bounds__(kThreads, 2) mma_gemm_kernel(const MmaParams p) {
  extern __shared__ __align__(16) uint32_t smem[];
  constexpr int TOK = 8 * MT, XC = stage_chunks<F>(), XROW = x_row_elems<F>(), XSTAGE = TOK * XROW;
  static_assert(XC % kDepth == 0, "the register ring must cycle within a stage");
  uint32_t* tab = smem;
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem + table_words<F>());

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane >> 2, t = lane & 3;
  const int mtile = blockIdx.x, split = blockIdx.y, nblk = blockIdx.z;
  const int c_begin = split * p.chunks_per_split;
  const int c_end = min(p.chunks, c_begin + p.chunks_per_split);
  const int n16 = nblk * kWarps + warp;
  const bool rows_live = n16 < p.n16;
  const int m0 = mtile * TOK;

  if constexpr (table_words<F>() > 0) {  // replicate each table word into all 32 banks
    for (int i = threadIdx.x; i < table_words<F>(); i += kThreads) tab[i] = __ldg(p.tables + (i >> 5));
  }

  // Activation stage [TOK tokens, XC chunks of K]: 16-byte cp.async pieces, zero-filled past M, K and the split.
  auto load_stage = [&](int c0, int buf) {
    __nv_bfloat16* dst = xs + buf * XSTAGE;
    constexpr int PIECES_PER_ROW = XC * F::KB / 8;
    const int k_end = min(p.K, c_end * F::KB);
    for (int i = threadIdx.x; i < TOK * PIECES_PER_ROW; i += kThreads) {
      const int r = i / PIECES_PER_ROW, pc = i % PIECES_PER_ROW;
      const int m = m0 + r, k = c0 * F::KB + pc * 8;
      const bool ok = m < p.M && k < k_end;
      cp_async16(dst + r * XROW + pc * 8, ok ? p.x + size_t(m) * p.K + k : p.x, ok ? 16 : 0);
    }
    cp_async_commit();
  };

  // The warp's code tiles: chunk c, half h at codes[(n16 * chunks + c) * 64 + h * 32 + lane] (uint4 units);
  // its scale bytes: (n16 * chunks + c) * 16 + h * 8 + q rows of META bytes.
  const size_t tile0 = size_t(rows_live ? n16 : 0) * p.chunks;
  const uint4* wp = p.codes + tile0 * 64 + lane;
  const uint8_t* mp = p.meta + (tile0 * 16 + q) * F::META;
  const uint8_t* mp2 = p.meta2 + (tile0 * 16 + q) * F::META2;
  auto load_codes = [&](int c, uint4 (&v)[2]) {
    if (rows_live && c < c_end) {
      v[0] = __ldg(wp + size_t(c) * 64);
      v[1] = __ldg(wp + size_t(c) * 64 + 32);
    } else {
      v[0] = v[1] = make_uint4(0, 0, 0, 0);
    }
  };

  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  uint4 ring[kDepth][2];
#pragma unroll
  for (int d = 0; d < kDepth; ++d) load_codes(c_begin + d, ring[d]);

  if (c_begin < c_end) load_stage(c_begin, 0);
  int buf = 0;
  for (int base = c_begin; base < c_end; base += XC) {
    if (base + XC < c_end) {  // prefetch the next activation stage, wait for this one
      load_stage(base + XC, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* xrow = xs + buf * XSTAGE + q * XROW + F::E * t;
    static_for<XC>([&](auto U) {
      constexpr int u = decltype(U)::value, d = u % kDepth;
      const int c = base + u;
      if (c < c_end) {
        uint4 next[2];
        load_codes(c + kDepth, next);  // refill this slot while the chunk below is decoded
        const size_t mrow = size_t(c) * 16;
        const auto s0 = F::scale(mp + mrow * F::META, mp2 + mrow * F::META2, t, ring[d][0], p.scale_mul);
        const auto s1 = F::scale(mp + (mrow + 8) * F::META, mp2 + (mrow + 8) * F::META2, t, ring[d][1], p.scale_mul);
        float part[MT][4];
#pragma unroll
        for (int j = 0; j < MT; ++j) part[j][0] = part[j][1] = part[j][2] = part[j][3] = 0.f;
        float(&target)[MT][4] = F::ACC ? part : acc;
        static_for<F::E / 8>([&](auto G) {
          constexpr int g = decltype(G)::value;
          uint32_t ar[4], ar8[4];
          F::template decode8<g>(ring[d][0], s0, tab, lane, ar);
          F::template decode8<g>(ring[d][1], s1, tab, lane, ar8);
#pragma unroll
          for (int j = 0; j < MT; ++j) {
            const uint4 b = *reinterpret_cast<const uint4*>(xrow + 8 * j * XROW + u * F::KB + 8 * g);
            mma16816(target[j], ar[0], ar8[0], ar[1], ar8[1], b.x, b.y);
            mma16816(target[j], ar[2], ar8[2], ar[3], ar8[3], b.z, b.w);
          }
        });
        if constexpr (F::ACC) {  // rows q and q+8: c0,c1 and c2,c3
          float s[2];
          if constexpr (F::E == 64) {
            s[0] = rows_live ? F::acc_scale(mp + mrow * F::META) : 0.f;
            s[1] = rows_live ? F::acc_scale(mp + (mrow + 8) * F::META) : 0.f;
          } else {  // FP8_BLOCK: uniform over the warp's 16 rows and the chunk's 64 k
            const int kblocks = (p.K + 127) / 128;
            s[0] = s[1] = rows_live ? __ldg(p.block_scale + size_t(n16 / 8) * kblocks + (c * F::KB) / 128) : 0.f;
          }
#pragma unroll
          for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][e] += s[e >> 1] * part[j][e];
        }
        ring[d][0] = next[0];
        ring[d][1] = next[1];
      }
    });
    __syncthreads();  // the stage is consumed: the next prefetch may overwrite it
    buf ^= 1;
  }

  // Epilogue. c0,c1: row q, tokens 2t, 2t+1; c2,c3: row q+8.
  const int row0 = n16 * 16 + q;
  auto finish = [&](int j, int e, float v) {
    const int m = m0 + 8 * j + 2 * t + (e & 1), n = row0 + 8 * (e >> 1);
    if (!rows_live || m >= p.M || n >= p.N) return;
    v *= p.alpha;
    if (p.bias) v += __bfloat162float(p.bias[n]);
    p.y[size_t(m) * p.ldy + n] = __float2bfloat16_rn(v);
  };
  if (p.splits == 1) {
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) finish(j, e, acc[j][e]);
    return;
  }
  auto part_index = [&](int s, int j, int e) {
    const int m = m0 + 8 * j + 2 * t + (e & 1), n = row0 + 8 * (e >> 1);
    return (size_t(s) * p.M + m) * p.N + n;
  };
  auto in_range = [&](int j, int e) {
    return rows_live && m0 + 8 * j + 2 * t + (e & 1) < p.M && row0 + 8 * (e >> 1) < p.N;
  };
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (in_range(j, e)) p.partials[part_index(split, j, e)] = acc[j][e];
  __threadfence();
  __syncthreads();
  __shared__ int last;
  int* ticket = p.tickets + size_t(nblk) * gridDim.x + mtile;
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1) == p.splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (!in_range(j, e)) continue;
      float v = 0.f;
      for (int s = 0; s < p.splits; ++s) v += __ldcg(p.partials + part_index(s, j, e));  // split order
      finish(j, e, v);
    }
  if (threadIdx.x == 0) *ticket = 0;  // ready for the next call (graph replays included)
}

template <class F, int MT>
cudaError_t launch(const MmaParams& p, int mtiles, int nblocks, cudaStream_t stream) {
  constexpr int smem_bytes = table_words<F>() * 4 + 2 * (8 * MT) * x_row_elems<F>() * int(sizeof(__nv_bfloat16));
  auto kernel = mma_gemm_kernel<F, MT>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  kernel<<<dim3(mtiles, p.splits, nblocks), kThreads, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

template <class F>
cudaError_t launch_mt(int mt, const MmaParams& p, int nblocks, cudaStream_t stream) {
  const int mtiles = (p.M + 8 * mt - 1) / (8 * mt);
  switch (mt) {
    case 1: return launch<F, 1>(p, mtiles, nblocks, stream);
    case 2: return launch<F, 2>(p, mtiles, nblocks, stream);
    case 4: return launch<F, 4>(p, mtiles, nblocks, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

int mma_chunk_k(int format) {
  switch (format) {
    case kMmaFP8: case kMmaFP8_BLOCK: case kMmaMXFP8: case kMmaQ8_0: return 64;
    case kMmaNVFP4: case kMmaMXFP4: return 128;
    case kMmaIQ2_XXS: case kMmaIQ2_XS: return 256;
    default: return 0;
  }
}

cudaError_t mma_gemm(const MmaArgs& a, cudaStream_t stream) {
  MmaParams p{};
  p.codes = reinterpret_cast<const uint4*>(a.codes);
  p.meta = a.meta;
  p.meta2 = a.meta2;
  p.block_scale = a.block_scale;
  p.tables = a.tables;
  p.alpha = a.alpha;
  p.scale_mul = a.scale_mul;
  p.x = a.x;
  p.bias = a.bias;
  p.y = a.y;
  p.ldy = a.ldy;
  p.M = a.M;
  p.N = a.N;
  p.K = a.K;
  p.n16 = (a.N + 15) / 16;
  p.chunks = a.chunks;
  p.splits = a.splits;
  p.chunks_per_split = (a.chunks + a.splits - 1) / a.splits;
  p.partials = a.partials;
  p.tickets = a.tickets;
  const int nblocks = (p.n16 + kWarps - 1) / kWarps;
  switch (a.format) {
    case kMmaFP8: return launch_mt<FmtFP8>(a.mt, p, nblocks, stream);
    case kMmaFP8_BLOCK: return launch_mt<FmtFP8Block>(a.mt, p, nblocks, stream);
    case kMmaMXFP8: return launch_mt<FmtMXFP8>(a.mt, p, nblocks, stream);
    case kMmaNVFP4: return launch_mt<FmtFP4<true>>(a.mt, p, nblocks, stream);
    case kMmaMXFP4: return launch_mt<FmtFP4<false>>(a.mt, p, nblocks, stream);
    case kMmaQ8_0: return launch_mt<FmtQ8_0>(a.mt, p, nblocks, stream);
    case kMmaIQ2_XXS: return launch_mt<FmtIQ2<false>>(a.mt, p, nblocks, stream);
    case kMmaIQ2_XS: return launch_mt<FmtIQ2<true>>(a.mt, p, nblocks, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace b12x
