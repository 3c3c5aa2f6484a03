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
constexpr int kStages = 4;  // per-warp shared-memory ring of weight chunks: kStages - 1 in flight
constexpr int kReplicas = 16;  // IQ2 tables: copies spread over banks (at most 2 lanes share a bank)

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
// are read from shared-memory tables replicated kReplicas times across the banks, so the warp's 32 random
// lookups conflict at most two-way. The sub-block factor (0.5+s)/4 multiplies in bf16 (exact; the product rounds once), the block's
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
    const int r = lane % kReplicas;
    const uint32_t sel = tab[grid_idx * kReplicas + r] | tab[(GRID + sign_idx) * kReplicas + r];
    iq2_values(sel, s.mul[G >> 1], a);
  }
};

// ---------------------------------------------------------------------------------------------- kernel
template <class F>
constexpr int stage_chunks() {  // chunks per activation stage (>= kStages - 1, see the group count below)
  return F::KB >= 256 ? 3 : 4;
}
template <class F>
constexpr int x_row_elems() {
  return stage_chunks<F>() * F::KB + 8;  // +16 bytes per row: consecutive tokens start in other banks
}
template <class F>
constexpr int table_words() {
  if constexpr (F::E == 64) return (F::GRID + 128) * kReplicas;
  return 0;
}
template <class F>
constexpr int slot_bytes() {  // one chunk of a warp: 1 KB of codes, then its 16 rows' scale bytes
  return 1024 + 16 * F::META + 16 * F::META2 + (F::ACC && F::E != 64 ? 16 : 0);
}
template <class F, int MT>
constexpr int smem_bytes() {
  return table_words<F>() * 4 + 2 * (8 * MT) * x_row_elems<F>() * 2 + kWarps * kStages * slot_bytes<F>();
}
template <class F, int MT>
constexpr int min_blocks() {  // register cap: as many CTAs per SM as shared memory allows, 2..4
  constexpr int fit = (227 * 1024) / (smem_bytes<F, MT>() + 1024);
  return fit >= 4 ? 4 : fit >= 3 ? 3 : 2;
}

template <class F, int MT>
__global__ void __launch_bounds__(kThreads, min_blocks<F, MT>()) mma_gemm_kernel(const MmaParams p) {
  extern __shared__ __align__(16) uint32_t smem[];
  constexpr int TOK = 8 * MT, XC = stage_chunks<F>(), XROW = x_row_elems<F>(), XSTAGE = TOK * XROW;
  constexpr int SLOT = slot_bytes<F>();
  static_assert(XC >= kStages - 1, "an activation stage must be complete when its first chunk is");
  uint32_t* tab = smem;
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem + table_words<F>());

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane >> 2, t = lane & 3;
  const int mtile = blockIdx.x, split = blockIdx.y, nblk = blockIdx.z;
  const int c_begin = split * p.chunks_per_split;
  const int c_end = min(p.chunks, c_begin + p.chunks_per_split);
  const int n16 = nblk * kWarps + warp;
  const bool rows_live = n16 < p.n16;
  const int m0 = mtile * TOK;
  uint8_t* ring = reinterpret_cast<uint8_t*>(xs + 2 * XSTAGE) + warp * kStages * SLOT;

  if constexpr (table_words<F>() > 0) {  // replica r of table word i at i * kReplicas + r
    for (int i = threadIdx.x; i < table_words<F>(); i += kThreads) tab[i] = __ldg(p.tables + i / kReplicas);
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
  };

  // This lane's copies of chunk c into ring slot c % kStages: its two 16-byte code pieces (tile (n16, c),
  // halves 0 and 1), and lanes 0.. / 16.. copy the tile's scale bytes (16 rows × META / META2, contiguous).
  const size_t tile0 = size_t(rows_live ? n16 : 0) * p.chunks;
  auto issue = [&](int c) {
    if (!rows_live || c >= c_end) return;
    uint8_t* slot = ring + (c % kStages) * SLOT;
    const uint4* codes = p.codes + (tile0 + c) * 64;
    cp_async16(slot + 16 * lane, codes + lane, 16);
    cp_async16(slot + 512 + 16 * lane, codes + 32 + lane, 16);
    if constexpr (F::META > 0) {
      if (lane < F::META) cp_async16(slot + 1024 + 16 * lane, p.meta + (tile0 + c) * 16 * F::META + 16 * lane, 16);
    }
    if constexpr (F::META2 > 0) {
      if (lane >= 16 && lane < 16 + F::META2)
        cp_async16(slot + 1024 + 16 * F::META + 16 * (lane - 16),
                   p.meta2 + (tile0 + c) * 16 * F::META2 + 16 * (lane - 16), 16);
    }
    if constexpr (F::ACC && F::E != 64) {  // FP8_BLOCK: the chunk's block scale (uniform over the warp)
      if (lane == 0) {
        const int kblocks = (p.K + 127) / 128;
        const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(slot + 1024));
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s),
                     "l"(p.block_scale + size_t(n16 / 8) * kblocks + (c * F::KB) / 128));
      }
    }
  };

  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  // cp.async groups, one committed per chunk in order: group g holds chunk g's weights (and, for the first
  // chunk of stage s, the activations of stage s+1). Waiting until kStages-2 groups remain before chunk i's
  // commit completes group i; stage s+1's activations (group first(s) + kStages-1) are then complete by
  // first(s+1) = first(s) + XC because XC >= kStages - 1.
  if (c_begin < c_end) load_stage(c_begin, 0);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    issue(c_begin + s);
    cp_async_commit();
  }
  int buf = 0;
  for (int base = c_begin; base < c_end; base += XC) {
    const __nv_bfloat16* xrow = xs + buf * XSTAGE + q * XROW + F::E * t;
    static_for<XC>([&](auto U) {
      constexpr int u = decltype(U)::value;
      const int c = base + u;
      if (c < c_end) {  // uniform over the CTA
        cp_async_wait<kStages - 2>();
        if (u == 0) {
          __syncthreads();  // this stage's activations are visible; every warp is done with the last one
          if (base + XC < c_end) load_stage(base + XC, buf ^ 1);
        }
        __syncwarp();  // the scale bytes other lanes copied are visible; slot c-1 is free
        issue(c + kStages - 1);
        cp_async_commit();
        if (rows_live) {
          const uint8_t* slot = ring + (c % kStages) * SLOT;
          const uint4 w0 = *reinterpret_cast<const uint4*>(slot + 16 * lane);
          const uint4 w1 = *reinterpret_cast<const uint4*>(slot + 512 + 16 * lane);
          const uint8_t* m = slot + 1024;
          const uint8_t* m2 = slot + 1024 + 16 * F::META;
          const auto s0 = F::scale(m + q * F::META, m2 + q * F::META2, t, w0, p.scale_mul);
          const auto s1 = F::scale(m + (8 + q) * F::META, m2 + (8 + q) * F::META2, t, w1, p.scale_mul);
          float part[MT][4];
#pragma unroll
          for (int j = 0; j < MT; ++j) part[j][0] = part[j][1] = part[j][2] = part[j][3] = 0.f;
          float(&target)[MT][4] = F::ACC ? part : acc;
          static_for<F::E / 8>([&](auto G) {
            constexpr int g = decltype(G)::value;
            uint32_t ar[4], ar8[4];
            F::template decode8<g>(w0, s0, tab, lane, ar);
            F::template decode8<g>(w1, s1, tab, lane, ar8);
#pragma unroll
            for (int j = 0; j < MT; ++j) {
              const uint4 b = *reinterpret_cast<const uint4*>(xrow + 8 * j * XROW + u * F::KB + 8 * g);
              mma16816(target[j], ar[0], ar8[0], ar[1], ar8[1], b.x, b.y);
              mma16816(target[j], ar[2], ar8[2], ar[3], ar8[3], b.z, b.w);
            }
          });
          if constexpr (F::ACC) {  // rows q and q+8: c0,c1 and c2,c3
            float sc[2];
            if constexpr (F::E == 64) {
              sc[0] = F::acc_scale(m + q * F::META);
              sc[1] = F::acc_scale(m + (8 + q) * F::META);
            } else {
              sc[0] = sc[1] = *reinterpret_cast<const float*>(m);
            }
#pragma unroll
            for (int j = 0; j < MT; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[j][e] += sc[e >> 1] * part[j][e];
          }
        }
      }
    });
    buf ^= 1;
  }
  cp_async_wait<0>();

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
  constexpr int bytes = smem_bytes<F, MT>();
  static_assert(bytes <= 227 * 1024, "shared memory of one CTA");
  auto kernel = mma_gemm_kernel<F, MT>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  kernel<<<dim3(mtiles, p.splits, nblocks), kThreads, bytes, stream>>>(p);
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

template <class F, int MT>
int blocks_per_sm() {
  auto kernel = mma_gemm_kernel<F, MT>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<F, MT>()) != cudaSuccess)
    return 0;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem_bytes<F, MT>()) != cudaSuccess)
    return 0;
  return blocks;
}

template <class F>
int blocks_per_sm_mt(int mt) {
  return mt == 1 ? blocks_per_sm<F, 1>() : mt == 2 ? blocks_per_sm<F, 2>() : mt == 4 ? blocks_per_sm<F, 4>() : 0;
}

int mma_blocks_per_sm(int format, int mt) {
  switch (format) {
    case kMmaFP8: return blocks_per_sm_mt<FmtFP8>(mt);
    case kMmaFP8_BLOCK: return blocks_per_sm_mt<FmtFP8Block>(mt);
    case kMmaMXFP8: return blocks_per_sm_mt<FmtMXFP8>(mt);
    case kMmaNVFP4: return blocks_per_sm_mt<FmtFP4<true>>(mt);
    case kMmaMXFP4: return blocks_per_sm_mt<FmtFP4<false>>(mt);
    case kMmaQ8_0: return blocks_per_sm_mt<FmtQ8_0>(mt);
    case kMmaIQ2_XXS: return blocks_per_sm_mt<FmtIQ2<false>>(mt);
    case kMmaIQ2_XS: return blocks_per_sm_mt<FmtIQ2<true>>(mt);
    default: return 0;
  }
}

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
