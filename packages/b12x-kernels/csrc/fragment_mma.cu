// The decode-sized GEMM on the CUTLASS family's "sm90" weight layout (fragment_mma.h says what it computes).
//
// Why this shape:
// - sm90_mixed_layout.cuh keeps, for every 16 weight rows and 16-deep k-block, one lane's eight A-fragment codes of
//   a 16x16 MMA block in one 32-bit word, the 32 lanes' words next to each other (128 bytes), and the k-blocks N * 8
//   bytes apart. The register-A fragment of a 64x16 wgmma is four m16n8k16 A fragments, one a warp, so each word is
//   exactly what lane (g, t) feeds mma.sync: rows g and g + 8, k 2t, 2t + 1, 2t + 8, 2t + 9. A warp reads its block
//   with one coalesced 32-bit load a lane, with no shared memory and no reshuffle.
// - 4-bit codes sit in the word in the order [0,2,4,6,1,3,5,7] of the fragment's values: shifting the word by 4i
//   leaves A register i's two codes (values 2i, 2i + 1) in the low nibbles of its two halves.
// - Two forms, by the tokens a pass (FragmentArgs::tokens). Up to kGemvTokens: a CTA is 16 weight rows whose eight
//   warps split its k-tiles, activations straight from global memory (fragment_gemv_kernel). From 8: a CTA is 128
//   rows, a warp's 16, over a range of k-tiles (64 deep), each step kBatch k-tiles: every warp loads its words for the
//   next step while the CTA's activations for this one arrive in shared memory (cp.async, one copy for the 8 warps;
//   read straight from global memory, 8 tokens' rows a warp-wide load, they were bound by L1 wavefronts: 16 tokens
//   ran 1.6x slower than 8) (fragment_gemm_kernel).
// - K is split across CTAs (FragmentArgs::splits) until the grid fills the GPU. Each split writes float32 partials,
//   and the last CTA of a row group or block (an atomic ticket) sums them in split order, so results are the same bits
//   every call.
// - Block scales decode through a 256-entry table in shared memory: byte -> bf16x2 splat of value * scale_mul.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "fragment_mma.h"
#include "mma_gemm.cuh"  // mma16816, bmul, splat_bf16, e4m3_to_float, e8m0_to_float, cp_async16

namespace b12x::fragment {
namespace {

using mma::bmul;
using mma::cp_async16;
using mma::cp_async_commit;
using mma::cp_async_wait;
using mma::e4m3_to_float;
using mma::e8m0_to_float;
using mma::mma16816;
using mma::splat_bf16;

constexpr int kWarps = 8;  // row groups of 16 a CTA
constexpr int kThreads = 32 * kWarps;
constexpr int kTileK = 64;            // the layout's k-tile: one scale carrier a row
constexpr int kBlocks = kTileK / 16;  // k-blocks of 16 a k-tile
constexpr int kBatch = 4;             // k-tiles a step: 2 KB of weight a warp in flight
constexpr int kGemvTokens = 4;        // tokens a pass of the 16-row form (kFragmentTokenTiles' first)
constexpr int kStepK = kBatch * kTileK;
// A token's activations for one step in shared memory: 256 bf16 and 4 words of padding, so the 32 lanes' loads of
// one k-block's B fragment (token g's word 8j + t, row stride 132 words: bank 4g + t + 8j) hit 32 banks.
constexpr int kRowWords = kStepK / 2 + 4;

struct Params : FragmentArgs {
  int row_groups;  // N / 16
  int k_tiles;     // K / 64
};

// A streamed weight word: read once, kept out of L1.
__device__ __forceinline__ uint32_t load_stream(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// A register i of the fragment (values 2i, 2i + 1: nibbles i and i + 4 of the word) as bf16x2 bit patterns worth
// value * 2^-126: magnitude (e1 e0 m) to bits 6-8 / 22-24, sign to 15 / 31.
template <int I>
__device__ __forceinline__ uint32_t e2m1_register(uint32_t word) {
  constexpr int kMag = 6 - 4 * I, kSign = 12 - 4 * I;  // left shifts (negative: right)
  const uint32_t mag = kMag >= 0 ? word << kMag : word >> -kMag;
  const uint32_t sign = word << kSign;
  return (mag & 0x01C001C0u) | (sign & 0x80008000u);
}

template <FragmentWeight W>
__device__ __forceinline__ float scale_value(uint32_t byte) {
  return W == FragmentWeight::NVFP4 ? e4m3_to_float(byte) : e8m0_to_float(byte);
}

// One warp's weights for one step: kBatch k-tiles' words and the carriers of rows g and g + 8.
struct StepWeights {
  uint32_t words[kBatch][kBlocks];
  uint32_t carriers[kBatch][2];
};

// One k-tile of a warp's weights: its four k-blocks' words and the carriers of rows g and g + 8.
template <FragmentWeight W>
__device__ __forceinline__ void load_tile(const Params& p, const uint32_t* w, int row, int kt, uint32_t (&words)[kBlocks],
                                          uint32_t (&carriers)[2]) {
  const size_t block_stride = size_t(p.row_groups) * 32;  // words from one k-block to the next
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) words[j] = load_stream(w + size_t(kt * kBlocks + j) * block_stride);
  if constexpr (W == FragmentWeight::NVFP4) {
    const uint32_t* c = static_cast<const uint32_t*>(p.scales) + size_t(kt) * p.n + row;
    carriers[0] = __ldg(c);
    carriers[1] = __ldg(c + 8);
  } else {
    const uint16_t* c = static_cast<const uint16_t*>(p.scales) + size_t(kt) * p.n + row;
    carriers[0] = __ldg(c);
    carriers[1] = __ldg(c + 8);
  }
}

template <FragmentWeight W>
__device__ __forceinline__ void load_step(const Params& p, const uint32_t* w, int row, int kt0, int tiles,
                                          StepWeights& s) {
#pragma unroll
  for (int b = 0; b < kBatch; ++b) {
    if (b < tiles) load_tile<W>(p, w, row, kt0 + b, s.words[b], s.carriers[b]);
  }
}

// k-block j of tile b as the four A registers (0 and 2 row g, 1 and 3 row g + 8).
template <FragmentWeight W>
__device__ __forceinline__ void decode_block(const uint32_t* scale_table, const StepWeights& s, int b, int j,
                                             uint32_t (&a)[4]) {
  // NVFP4: byte j of the carrier (16 k each); MXFP4: byte j / 2 (32 k each)
  const int shift = W == FragmentWeight::NVFP4 ? 8 * j : 8 * (j >> 1);
  const uint32_t s_lo = scale_table[(s.carriers[b][0] >> shift) & 0xFFu];
  const uint32_t s_hi = scale_table[(s.carriers[b][1] >> shift) & 0xFFu];
  const uint32_t word = s.words[b][j];
  a[0] = bmul(e2m1_register<0>(word), s_lo);
  a[1] = bmul(e2m1_register<1>(word), s_hi);
  a[2] = bmul(e2m1_register<2>(word), s_lo);
  a[3] = bmul(e2m1_register<3>(word), s_hi);
}

// Up to kGemvTokens tokens: a CTA is 16 weight rows, its eight warps splitting the CTA's k-tiles, summed through shared
// memory in warp order; activations straight from global memory (a warp-wide load touches kGemvTokens rows). At one to
// four tokens this beat the 128-row form (the Llama-3.1-8B layer at one token 70-73 against 81-89 µs on the H100):
// no K split is needed to fill the GPU, so no partials.
template <FragmentWeight W>
__global__ void __launch_bounds__(kThreads) fragment_gemv_kernel(const Params p) {
  __shared__ uint32_t scale_table[256];
  __shared__ float reduce[kWarps][32][4];
  __shared__ bool last_split;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int group = blockIdx.x, split = blockIdx.y, pass = blockIdx.z;
  const int token0 = pass * kGemvTokens;
  const int row = group * 16 + g;  // and row + 8

  scale_table[threadIdx.x] = splat_bf16(scale_value<W>(threadIdx.x) * p.scale_mul);
  __syncthreads();

  const int kt_begin = int(int64_t(split) * p.k_tiles / p.splits);
  const int kt_end = int(int64_t(split + 1) * p.k_tiles / p.splits);
  const uint32_t* w = static_cast<const uint32_t*>(p.w) + size_t(group) * 32 + lane;
  // This lane's token row of the n8 MMA (B fragment: token g, k 2t, 2t + 1 and 2t + 8, 2t + 9); null past the pass
  const __nv_bfloat16* xrow = g < kGemvTokens && token0 + g < p.m
                                  ? static_cast<const __nv_bfloat16*>(p.x) + size_t(token0 + g) * p.k + 2 * t
                                  : nullptr;
  float acc[4] = {};
  for (int kt0 = kt_begin + warp; kt0 < kt_end; kt0 += kWarps * kBatch) {
    StepWeights now;
    // this warp's k-tiles kt0, kt0 + 8, ...: load_step's consecutive tiles, strided
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int kt = kt0 + b * kWarps;
      if (kt < kt_end) load_tile<W>(p, w, row, kt, now.words[b], now.carriers[b]);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int kt = kt0 + b * kWarps;
      if (kt >= kt_end) break;
#pragma unroll
      for (int j = 0; j < kBlocks; ++j) {
        uint32_t a[4];
        decode_block<W>(scale_table, now, b, j, a);
        uint32_t b0 = 0, b1 = 0;
        if (xrow) {
          const uint32_t* xk = reinterpret_cast<const uint32_t*>(xrow + kt * kTileK) + 8 * j;
          b0 = __ldg(xk);
          b1 = __ldg(xk + 4);
        }
        mma16816(acc, a[0], a[1], a[2], a[3], b0, b1);
      }
    }
  }

  // The CTA's sum, in warp order: value v = lane * 4 + i of the row group's fragment
#pragma unroll
  for (int i = 0; i < 4; ++i) reduce[warp][lane][i] = acc[i];
  __syncthreads();
  if (threadIdx.x >= 128) return;
  const int v = threadIdx.x;
  float sum = 0.f;
#pragma unroll
  for (int wi = 0; wi < kWarps; ++wi) sum += (&reduce[wi][0][0])[v];
  if (p.splits > 1) {
    // The last split of this row group sums every split's partials in split order.
    float* partials = p.partials + (size_t(pass) * p.splits * p.row_groups + group) * 128 + v;  // split 0's
    const size_t split_stride = size_t(p.row_groups) * 128;
    partials[split * split_stride] = sum;
    __threadfence();
    asm volatile("bar.sync 1, 128;" ::: "memory");  // the 128 threads left
    int* ticket = p.tickets + size_t(pass) * p.row_groups + group;
    if (v == 0) last_split = atomicAdd(ticket, 1) == p.splits - 1;
    asm volatile("bar.sync 1, 128;" ::: "memory");
    if (!last_split) return;
    __threadfence();
    if (v == 0) *ticket = 0;  // zero at rest
    sum = 0.f;
    for (int sp = 0; sp < p.splits; ++sp) sum += __ldcg(partials + sp * split_stride);
  }
  // C fragment: value i of lane l is row g' (+ 8 for i >= 2), token 2t' + (i & 1) (g' = l / 4, t' = l % 4)
  const int l = v / 4, i = v % 4;
  const int out_row = group * 16 + (l >> 2) + (i >= 2 ? 8 : 0);
  const int tok = 2 * (l & 3) + (i & 1), token = token0 + tok;
  if (tok < kGemvTokens && token < p.m) {
    float out = sum * p.alpha_shift * p.alpha[out_row];
    if (p.bias) out += __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[out_row]);
    static_cast<__nv_bfloat16*>(p.y)[size_t(token) * p.n + out_row] = __float2bfloat16_rn(out);
  }
}

// From 5 tokens: a CTA is 128 rows, a warp's 16, with the activations staged once for the 8 warps. kT8: n8 MMAs a
// k-block (the CTA's tokens / 8).
template <FragmentWeight W, int kT8>
__global__ void __launch_bounds__(kThreads) fragment_gemm_kernel(const Params p) {
  __shared__ uint32_t scale_table[256];
  __shared__ __align__(16) uint32_t xs[8 * kT8][kRowWords];
  __shared__ bool last_split;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int block = blockIdx.x, split = blockIdx.y, pass = blockIdx.z;
  const int group = block * kWarps + warp;  // this warp's 16 rows
  const bool rows_here = group < p.row_groups;  // N a multiple of 64, not of 128: the last block's upper half
  const int token0 = pass * 8 * kT8;
  const int row = group * 16 + g;  // and row + 8

  scale_table[threadIdx.x] = splat_bf16(scale_value<W>(threadIdx.x) * p.scale_mul);

  const int kt_begin = int(int64_t(split) * p.k_tiles / p.splits);
  const int kt_end = int(int64_t(split + 1) * p.k_tiles / p.splits);
  const uint32_t* w = static_cast<const uint32_t*>(p.w) + size_t(group) * 32 + lane;
  const __nv_bfloat16* x = static_cast<const __nv_bfloat16*>(p.x);

  float acc[kT8][4] = {};
  StepWeights next;
  if (rows_here) load_step<W>(p, w, row, kt_begin, min(kBatch, kt_end - kt_begin), next);
  for (int kt0 = kt_begin; kt0 < kt_end; kt0 += kBatch) {
    const int tiles = min(kBatch, kt_end - kt0);
    // this step's activations: 8 kT8 token rows x (tiles x 64) k, 16 bytes a copy, rows past M zero
    constexpr int kChunks = kStepK / 8;  // 16-byte chunks a row
    for (int c = threadIdx.x; c < 8 * kT8 * kChunks; c += kThreads) {
      const int r = c / kChunks, col = c % kChunks;
      if (col < tiles * (kTileK / 8)) {
        const int token = token0 + r;
        const bool live = token < p.m;
        cp_async16(&xs[r][col * 4], live ? x + size_t(token) * p.k + size_t(kt0) * kTileK + col * 8 : x,
                   live ? 16 : 0);
      }
    }
    cp_async_commit();
    const StepWeights now = next;
    const int next_kt = kt0 + kBatch;
    if (rows_here && next_kt < kt_end) load_step<W>(p, w, row, next_kt, min(kBatch, kt_end - next_kt), next);
    cp_async_wait<0>();
    __syncthreads();  // the step's activations (and, the first time, the scale table) are in
    if (rows_here) {
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (b >= tiles) break;
#pragma unroll
        for (int j = 0; j < kBlocks; ++j) {
          uint32_t a[4];
          decode_block<W>(scale_table, now, b, j, a);
#pragma unroll
          for (int n8 = 0; n8 < kT8; ++n8) {
            // token g of the n8 block, k 2t, 2t + 1 (word 8j + t of the k-tile) and 2t + 8, 2t + 9 (4 words on)
            const uint32_t* xk = &xs[8 * n8 + g][b * (kTileK / 2) + 8 * j + t];
            mma16816(acc[n8], a[0], a[1], a[2], a[3], xk[0], xk[4]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with the step's activations before the next step's land
  }

  // A lane's outputs, in fragment order (n8, i): rows g (+ 8 for i >= 2), tokens 8 n8 + 2t + (i & 1).
  constexpr int kValues = kT8 * 32 * 4;  // a row group's outputs
  if (p.splits > 1) {
    // The last split of this row block sums every split's partials in split order.
    float* mine = p.partials + ((size_t(pass) * p.splits + split) * p.row_groups + group) * kValues + lane * 4;
    if (rows_here) {
#pragma unroll
      for (int n8 = 0; n8 < kT8; ++n8) {
#pragma unroll
        for (int i = 0; i < 4; ++i) mine[n8 * 128 + i] = acc[n8][i];
      }
    }
    __threadfence();
    __syncthreads();
    int* ticket = p.tickets + size_t(pass) * gridDim.x + block;
    if (threadIdx.x == 0) last_split = atomicAdd(ticket, 1) == p.splits - 1;
    __syncthreads();
    if (!last_split) return;
    __threadfence();
    if (threadIdx.x == 0) *ticket = 0;  // zero at rest
    if (!rows_here) return;
    const float* first = p.partials + (size_t(pass) * p.splits * p.row_groups + group) * kValues + lane * 4;
    const size_t split_stride = size_t(p.row_groups) * kValues;
#pragma unroll
    for (int n8 = 0; n8 < kT8; ++n8) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float sum = 0.f;
        for (int sp = 0; sp < p.splits; ++sp) sum += __ldcg(first + sp * split_stride + n8 * 128 + i);
        acc[n8][i] = sum;
      }
    }
  }
  if (!rows_here) return;
  __nv_bfloat16* y = static_cast<__nv_bfloat16*>(p.y);
  const __nv_bfloat16* bias = static_cast<const __nv_bfloat16*>(p.bias);
#pragma unroll
  for (int n8 = 0; n8 < kT8; ++n8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int out_row = row + (i >= 2 ? 8 : 0);
      const int token = token0 + 8 * n8 + 2 * t + (i & 1);
      if (token < p.m) {
        float out = acc[n8][i] * p.alpha_shift * p.alpha[out_row];
        if (bias) out += __bfloat162float(bias[out_row]);
        y[size_t(token) * p.n + out_row] = __float2bfloat16_rn(out);
      }
    }
  }
}

template <FragmentWeight W, int kT8>
cudaError_t launch(const Params& p, cudaStream_t stream) {
  const dim3 grid((p.row_groups + kWarps - 1) / kWarps, p.splits, (p.m + 8 * kT8 - 1) / (8 * kT8));
  fragment_gemm_kernel<W, kT8><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <FragmentWeight W>
cudaError_t launch_tokens(const Params& p, cudaStream_t stream) {
  switch (p.tokens) {
    case kGemvTokens: {
      const dim3 grid(p.row_groups, p.splits, (p.m + kGemvTokens - 1) / kGemvTokens);
      fragment_gemv_kernel<W><<<grid, kThreads, 0, stream>>>(p);
      return cudaGetLastError();
    }
    case 8: return launch<W, 1>(p, stream);
    case 16: return launch<W, 2>(p, stream);
    case 32: return launch<W, 4>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

const char* fragment_args_error(const FragmentArgs& a) {
  if (a.weight != int(FragmentWeight::NVFP4) && a.weight != int(FragmentWeight::MXFP4)) {
    return "decodes NVFP4 and MXFP4 only";
  }
  if (a.m < 1) return "needs m >= 1";
  if (a.n < 64 || a.n % 64) return "needs N a positive multiple of 64";
  if (a.k < kTileK || a.k % kTileK) return "needs K a positive multiple of 64";
  bool tile = false;
  for (int tokens : kFragmentTokenTiles) tile |= a.tokens == tokens;
  if (!tile) return "no kernel for that token tile (4, 8, 16 or 32 tokens)";
  if (a.splits < 1 || a.splits > a.k / kTileK) return "needs 1 <= splits <= K / 64";
  if (!a.w || !a.scales || !a.x || !a.y || !a.alpha) return "null weight, scales, x, y or alpha";
  if (a.splits > 1 && (!a.partials || !a.tickets)) return "a split call needs its partials and tickets";
  const auto misaligned = [](const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes != 0; };
  if (misaligned(a.x, 16)) return "x needs 16-byte alignment (its rows are copied 16 bytes at a time)";
  if (misaligned(a.w, 4) || misaligned(a.scales, 4) || misaligned(a.y, 2) || misaligned(a.alpha, 4) ||
      misaligned(a.bias, 2) || misaligned(a.partials, 4) || misaligned(a.tickets, 4)) {
    return "weight, scales, alpha, partials and tickets need 4-byte alignment, y and bias 2";
  }
  if (!(a.scale_mul > 0.f) || !(a.alpha_shift > 0.f)) return "needs scale_mul and alpha_shift > 0";
  return nullptr;
}

size_t fragment_partial_floats(int m, int n, int splits, int tokens) {
  if (splits <= 1 || tokens < kGemvTokens) return 0;
  if (tokens == kGemvTokens) return (size_t(m) + tokens - 1) / tokens * splits * (size_t(n) / 16) * 128;
  const size_t passes = (size_t(m) + tokens - 1) / tokens;
  return passes * splits * (size_t(n) / 16) * (size_t(tokens) / 8) * 32 * 4;
}

int fragment_tickets(int m, int n, int splits, int tokens) {
  if (splits <= 1 || tokens < kGemvTokens) return 0;
  if (tokens == kGemvTokens) return int((size_t(m) + tokens - 1) / tokens * (size_t(n) / 16));  // one a row group
  return int((size_t(m) + tokens - 1) / tokens * ((size_t(n) / 16 + kWarps - 1) / kWarps));  // one a row block
}

cudaError_t fragment_gemm(const FragmentArgs& a, cudaStream_t stream) {
  if (fragment_args_error(a)) return cudaErrorInvalidValue;
  Params p;
  static_cast<FragmentArgs&>(p) = a;
  p.row_groups = a.n / 16;
  p.k_tiles = a.k / kTileK;
  return a.weight == int(FragmentWeight::NVFP4) ? launch_tokens<FragmentWeight::NVFP4>(p, stream)
                                                : launch_tokens<FragmentWeight::MXFP4>(p, stream);
}

}  // namespace b12x::fragment
