#pragma once
// The warp-specialized Hopper (sm_90a) form of the tensor-core mixed-input GEMM: one warpgroup decodes, two multiply.
// The plan's rt = 2 selects it (each multiplying warp holds two 16-row tiles); same weights (layout "mma"), same
// argument block (MmaPlan), same epilogues and split-K reduction as wgmma_gemm.cu and mma_gemm.cuh.
//
// Why: wgmma_gemm.cu's warps each decode their own A fragments and then multiply. Nsight Compute at 1024 tokens (H200):
// the tensor pipe 46% busy and no warp eligible 67% of cycles: two warpgroups, each one accumulator chain, cannot
// keep the tensor cores fed while they also decode. Here the decode is another warpgroup's job and runs ahead:
//
//   warpgroup 0 (decode): each warp streams two 16-row weight tiles per K chunk (bulk copies into a ring of R raw
//     chunks, its own mbarriers), reads them into registers, and writes them as bf16 into a shared-memory A stage of
//     128 rows × 64 columns (16 KB, K-major, no swizzle: core matrices of 8 rows × 16 bytes, row-group stride 256,
//     K halves 128 apart), then arrives on the stage's a_full barrier (all 128 threads, after fence.proxy.async:
//     the wgmmas read shared memory through the async proxy). Warp w puts tile 2w in rows 16w.. of A half 0 and
//     tile 2w+1 in rows 16w.. of A half 1, so multiplying warp j of warpgroup 1 + u holds row tile 2j + u.
//   warpgroups 1 and 2 (multiply): warpgroup 1 + u owns A half u (64 rows) and every token of the CTA (8·mt, wgmma's
//     N), as CUTLASS's consumers own rows of the tile: each k16 step is one SS wgmma (m64 n(8·mt) k16, both operands
//     in shared memory) a warpgroup, so a stage's A is read once and its x twice. (A first form gave each warpgroup
//     half the tokens over both row halves: A read twice, x twice, twice the wgmmas of half the N; Nsight Compute
//     and the token-tile scaling showed time following shared-memory bytes.) One ring of x stages, refilled by the
//     first multiplying thread with one bulk copy per stage (x staged by stage_x_kernel in 64-column sub-chunks, so
//     the CTA's token groups of a sub-chunk are contiguous). Per 64-column stage: wait x_full and a_full, issue the
//     4 k16 steps, commit, wait for all but this group (wgmma.wait_group 1), then release the previous stage's A
//     (a_empty, 256 arrivals) and x (x_empty, 256 arrivals; the first thread waits for them and refills it).
// The k order within a chunk is the repack's (lane t's E elements, four per k16 step; see wgmma_gemm.cu): the decoded
// A and the staged x agree on it, so the product is the GEMM's. Stages are 64 columns (FP4's 128-column chunk is two):
// x at 256 tokens takes 32 KB and A 16 KB, so 4-6 x stages, 4 A stages and 3 raw chunks fit 227 KB, one CTA an SM
// (384 threads, at most 168 registers: 128 accumulators a multiplying thread at 256 tokens).
// `ablate` (B12X_WS_ABLATE; profiling only, NVFP4's linear form only) runs ABL, an instance of its own, so the real
// kernels carry no branch for it: a branch around the wgmmas made ptxas commit an empty wgmma group every stage
// (C7519), so that wgmma.wait_group 1 waited for the stage's own wgmmas. Its bits leave out or change one part of the
// work, so a timing shows what bounds the kernel (the results are wrong, except under 32 and 128): 1 the decode and A
// stores, 2 the wgmmas, 4 the x copies, 8 the weight copies; 16 reads both operands through 128-byte-swizzle
// descriptors (8-row atoms of 1 KB; the bytes are not laid out for it: only the timing means anything); 32 waits
// without the deadlock bound (bar_wait: no %globaltimer read after a failed try); 64 leaves out the decoder's
// fence.proxy.async per stage; 128 the proxy fences before the ring refills (the weights' after their generic
// reads, x's after the wgmmas' reads).
// Formats as wgmma_gemm.cu (no per-chunk fp32 scale). The grouped form (a fused MoE's GEMMs over the block table of
// 8·mt-slot blocks, GROUPED) differs as wgmma_gemm.cu's: one CTA per table block, the block's expert's weights, the
// slots' input rows gathered by stage_x_grouped_kernel, the slots' output rows in store_tile.
#include <type_traits>

#include "wgmma_common.cuh"

namespace b12x {
namespace wgmma_ws {
using namespace wgmma;  // the PTX helpers, stage_x_kernel, and through wgmma mma's decode functors and store_tile

constexpr int kThreads = 3 * 128;     // warpgroup 0 decodes, 1 and 2 multiply
constexpr int kSubK = 64;             // K columns per shared-memory stage
constexpr int kSteps = kSubK / 16;    // k16 steps per stage
constexpr int kABytes = 128 * kSubK * 2;  // one decoded A stage: 128 rows of bf16
constexpr int kHalfA = 64 * 16 * 2;   // one row half's one k16 step (8 row groups × 256 bytes)
constexpr int kXGroup = kSubK * 16;   // one group of 8 tokens of a staged x sub-chunk (bytes)
static_assert(kWarps == 8, "128 rows per CTA: 8 tiles, two per decoding warp");

template <class F, int MT>
struct Shape {
  static constexpr int TOK = 8 * MT;                  // tokens per CTA
  static constexpr int H = F::KB / kSubK;             // stages per K chunk
  static constexpr int XB = TOK / 8 * kXGroup;        // one x stage: the CTA's tokens, 64 columns
  static constexpr int RAW = kWarps * slot_bytes<F>();  // one chunk's 8 raw tiles (codes, then their scale bytes)
  static constexpr int SA = 4, R = 3;                 // A stages, raw chunks
  static constexpr int BUDGET = 227 * 1024 - 4096;    // dynamic shared memory, leaving room for the static part
  static constexpr int SX_FIT = (BUDGET - SA * kABytes - R * RAW) / XB;
  static constexpr int SX = SX_FIT > 6 ? 6 : SX_FIT;  // x stages
  static constexpr int BYTES = SX * XB + SA * kABytes + R * RAW;
  static_assert(F::KB % kSubK == 0 && F::E % (8 * H) == 0, "whole stages of whole decode groups");
  static_assert(SX >= 3, "at least one x stage in flight beyond the two the wgmmas hold");
};

// grid (token tiles, or table blocks when GROUPED, K splits, 128-row blocks), as wgmma_gemm_kernel's.
template <class F, int MT, bool GROUPED = false, bool ABL = false>
__global__ void __launch_bounds__(kThreads, 1) wgmma_ws_gemm_kernel(const MmaParams p, const uint8_t* staged,
                                                                      int ablate) {
#ifdef B12X_WGMMA_DEVICE
  static_assert(!F::ACC, "a per-chunk fp32 scale needs partial accumulators, which this kernel does not keep");
  const int abl = ABL ? ablate : 0;  // constant 0 in the real kernels: every ablation branch folds away
  using Sh = Shape<F, MT>;
  constexpr int TOK = Sh::TOK, H = Sh::H, SX = Sh::SX, SA = Sh::SA, R = Sh::R;
  constexpr int SLOT = slot_bytes<F>();
  constexpr int GPS = F::E / 8 / H;  // decode groups (two k16 steps each) per stage
  static_assert(2 * GPS == kSteps, "a stage is four k16 steps");
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* xring = smem;                        // [SX][XB]
  uint8_t* aring = smem + SX * Sh::XB;          // [SA][kABytes]
  uint8_t* rawring = aring + SA * kABytes;      // [R][decoding warp][2 tiles][SLOT]
  __shared__ int src_row[TOK], dst_row[TOK];
  __shared__ __align__(8) uint64_t x_full[SX], x_empty[SX], a_full[SA], a_empty[SA], raw_full[4][R];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2, q = lane >> 2, t = lane & 3;
  const int mtile = blockIdx.x, split = blockIdx.y, nblk = blockIdx.z;
  const int c_begin = split * p.chunks_per_split;
  const int chunks = max(0, min(p.chunks, c_begin + p.chunks_per_split) - c_begin);
  const int stages = chunks * H;  // 64-column stages of this split
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < SX; ++s) bar_init(&x_full[s], 1), bar_init(&x_empty[s], 256);
#pragma unroll
    for (int s = 0; s < SA; ++s) bar_init(&a_full[s], 128), bar_init(&a_empty[s], 256);
#pragma unroll
    for (int s = 0; s < R; ++s)
#pragma unroll
      for (int w = 0; w < 4; ++w) bar_init(&raw_full[w][s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // its barrier publishes the mbarriers; a table block with nothing for this CTA returns (uniformly)
  const int expert = tile_rows<TOK>(p, mtile, src_row, dst_row);
  if (expert < 0) return;
  auto wait = [abl](uint64_t* bar, uint32_t parity) {
    if (abl & 32) bar_wait(bar, parity);
    else bar_wait_bounded(bar, parity);
  };

  float acc[1][MT][4];  // multiplying warps: their row tile × the CTA's tokens (wgmma's D, as store_tile reads it)
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.f;
  int tile_base = p.n16;  // the decoding warpgroup stores nothing (every row past N) but joins store_tile's barriers

  if (wg == 0) {
    // ------------------------------------------------------------------------------------ decode (warp w)
    const int w = warp, first = nblk * kWarps + 2 * w;  // its tiles: first (A half 0), first + 1 (A half 1)
    const int live = min(2, max(0, p.n16 - first));
    const size_t first_global = size_t(expert) * p.n16 + first;  // grouped: the expert's weight in the stack
    uint8_t* raw = rawring + w * 2 * SLOT;
    const uint64_t weights_policy = l2_policy_first();
    auto fetch = [&](int i) {  // chunk i of the split into raw stage i % R (lane 0)
      if (i >= chunks) return;
      const int st = i % R, c = c_begin + i;
      uint64_t* bar = &raw_full[w][st];
      // this stage's earlier generic reads (R chunks ago) before the async writes (CUTLASS orders this case by the
      // mbarriers alone: mode 128 times it without)
      if (!(abl & 128)) fence_proxy_async();
      if (abl & 8) {
        bar_arrive_expect(bar, 0);
        return;
      }
      bar_arrive_expect(bar, live * (1024 + 16 * F::META));
      for (int r = 0; r < live; ++r) {
        uint8_t* slot = raw + st * (4 * 2 * SLOT) + r * SLOT;
        const size_t tile = (first_global + r) * p.chunks + c;
        bulk_copy(slot, p.codes + tile * 1024, 1024, bar, weights_policy);
        if constexpr (F::META > 0) bulk_copy(slot + 1024, p.meta + tile * 16 * F::META, 16 * F::META, bar, weights_policy);
      }
    };
    if (lane == 0)
#pragma unroll
      for (int i = 0; i < R; ++i) fetch(i);
    using Sc = typename F::S;
    for (int i = 0; i < chunks; ++i) {
      const int st = i % R;
      wait(&raw_full[w][st], (i / R) & 1);
      uint4 w0[2], w1[2];  // rows q and q + 8 of each tile: the lane's E elements of the chunk
      Sc s0[2], s1[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (r < live) {
          const uint8_t* slot = raw + st * (4 * 2 * SLOT) + r * SLOT;
          w0[r] = *reinterpret_cast<const uint4*>(slot + 16 * lane);
          w1[r] = *reinterpret_cast<const uint4*>(slot + 512 + 16 * lane);
          s0[r] = F::scale(slot + 1024 + q * F::META, nullptr, t, w0[r], p.scale_mul);
          s1[r] = F::scale(slot + 1024 + (8 + q) * F::META, nullptr, t, w1[r], p.scale_mul);
        }
      }
      __syncwarp();  // every lane has read the raw stage: lane 0 refills it
      if (lane == 0) fetch(i + R);
      static_for<H>([&](auto Hc) {
        constexpr int h = decltype(Hc)::value;
        const int s = i * H + h, as = s % SA;
        // both multiplying warpgroups are done with this A stage (its use SA stages ago)
        wait(&a_empty[as], ((s / SA) & 1) ^ 1);
        uint8_t* a = aring + as * kABytes + (2 * w) * 256 + 16 * q + 4 * t;  // row group 2w, this lane's 4 bytes
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (r >= live || (abl & 1)) continue;
          static_for<GPS>([&](auto Gc) {
            constexpr int G = decltype(Gc)::value, g = h * GPS + G;
            uint32_t lo[4], hi[4];  // rows q and q + 8: the A fragments of steps 2G and 2G + 1
            F::template decode8<g>(w0[r], s0[r], nullptr, lane, lo);
            F::template decode8<g>(w1[r], s1[r], nullptr, lane, hi);
#pragma unroll
            for (int u = 0; u < 2; ++u) {  // step 2G + u: K half 0 (slots 2t, 2t+1), K half 1 (8+2t, 9+2t)
              uint8_t* step = a + (r * kSteps + 2 * G + u) * kHalfA;
              *reinterpret_cast<uint32_t*>(step) = lo[2 * u];
              *reinterpret_cast<uint32_t*>(step + 256) = hi[2 * u];
              *reinterpret_cast<uint32_t*>(step + 128) = lo[2 * u + 1];
              *reinterpret_cast<uint32_t*>(step + 256 + 128) = hi[2 * u + 1];
            }
          });
        }
        if (!(abl & 64)) fence_proxy_async();  // the generic writes before the wgmmas' async-proxy reads
        bar_arrive(&a_full[as]);
      });
    }
  } else {
    // ------------------------------------------------------------------------------------ multiply (warpgroup u)
    const int u = wg - 1, j = warp & 3;
    const bool leader = threadIdx.x == 128;
    float(&d)[TOK / 2] = reinterpret_cast<float(&)[TOK / 2]>(acc[0]);
    const int groups = GROUPED ? p.blocks * MT : (p.M + 7) / 8;  // staged groups of 8 rows (grouped: whole tiles)
    const int g0 = mtile * MT;                                    // the CTA's first
    // only the staged groups: token columns past them are never stored, so whatever the stage held there is harmless
    const uint32_t x_bytes = (abl & 4) ? 0u : uint32_t(min(Sh::XB, max(0, (groups - g0) * kXGroup)));
    const uint64_t x_policy = l2_policy_last();  // every 128-row block of CTAs re-reads x
    auto fetch = [&](int s) {  // stage s of the split into x stage s % SX (the leader)
      if (s >= stages) return;
      const int st = s % SX, c = c_begin + s / H, h = s % H;
      bar_arrive_expect(&x_full[st], x_bytes);
      if (x_bytes)
        bulk_copy(xring + st * Sh::XB, staged + ((size_t(c) * H + h) * groups + g0) * kXGroup, x_bytes, &x_full[st],
                  x_policy);
    };
    if (leader)
#pragma unroll
      for (int s = 0; s < SX; ++s) fetch(s);
    for (int s = 0; s < stages; ++s) {
      const int xst = s % SX, as = s % SA;
      wait(&x_full[xst], (s / SX) & 1);
      wait(&a_full[as], (s / SA) & 1);
      fence_operands(d);
      wg_fence();
      const uint32_t xa = smem_addr(xring + xst * Sh::XB);
      const uint32_t aa = smem_addr(aring + (as * 2 * kSteps + u * kSteps) * kHalfA);  // stage as, row half u
      if (abl & 16) {
        // 128-byte swizzle, K-major: start | LBO 16 (unused) | SBO 1024 (8-row atoms) | mode 1 << 62; k16 = 32 bytes
        const uint64_t sw = (uint64_t(1) << 62) | (desc_field(1024) << 32) | (desc_field(16) << 16);
        static_for<kSteps>([&](auto Kc) {
          constexpr int k = decltype(Kc)::value;
          mma_ss<TOK>(d, sw | desc_field(aa + k * 32), sw | desc_field(xa + k * 32));
        });
        wg_commit();
        wg_wait<1>();
      } else if (!(abl & 2)) {  // each branch commits its own group (no empty group where no wgmma was issued);
        // one loop selecting the descriptors by `abl` made ptxas fence and commit every wgmma alone (C7519)
        static_for<kSteps>([&](auto Kc) {
          constexpr int k = decltype(Kc)::value;
          // A: row groups 256 apart, K halves 128; x: token groups kXGroup apart, K halves 128
          mma_ss<TOK>(d, smem_desc<256>(aa + k * kHalfA), smem_desc<kXGroup>(xa + k * 256));
        });
        wg_commit();
        wg_wait<1>();  // stage s - 1's wgmmas are done: release its A and x
      }
      fence_operands(d);
      if (s > 0) {
        const int prev = s - 1;
        bar_arrive(&a_empty[prev % SA]);
        bar_arrive(&x_empty[prev % SX]);
        if (leader && prev + SX < stages) {
          wait(&x_empty[prev % SX], (prev / SX) & 1);
          if (!(abl & 128)) fence_proxy_async();  // (its readers were wgmmas, async proxy themselves)
          fetch(prev + SX);
        }
      }
    }
    wg_wait<0>();
    fence_operands(d);
    tile_base = nblk * kWarps + 2 * j + u;
  }
  store_tile<1, MT>(p, acc, tile_base, expert, split, mtile, nblk, dst_row);
#endif  // B12X_WGMMA_DEVICE
}

template <class F, int MT>
cudaError_t launch(const MmaParams& p, uint8_t* staged, int ablate, cudaStream_t stream) {
  using Sh = Shape<F, MT>;
  static_assert(Sh::BYTES <= 227 * 1024 - 4096, "shared memory of one CTA");
  const bool grouped = p.order != nullptr;
  const int groups = grouped ? p.blocks * MT : (p.M + 7) / 8;
  const long long pieces = (long long)groups * 8 * p.chunks * (F::KB / 8);
  const unsigned stage_blocks = unsigned((pieces + 255) / 256);
  if (grouped) {
    stage_x_grouped_kernel<F, kSubK><<<stage_blocks, 256, 0, stream>>>(p, staged, groups, Sh::TOK);
  } else {
    stage_x_kernel<F, kSubK><<<stage_blocks, 256, 0, stream>>>(p.x, staged, p.M, p.K, p.chunks, groups);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  auto kernel = grouped ? wgmma_ws_gemm_kernel<F, MT, true> : wgmma_ws_gemm_kernel<F, MT, false>;
  if constexpr (std::is_same_v<F, FmtFP4<true>>) {  // the profiling instance (NVFP4's linear form only)
    if (ablate && !grouped) kernel = wgmma_ws_gemm_kernel<F, MT, false, true>;
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Sh::BYTES);
  if (err != cudaSuccess) return err;
  const int mtiles = grouped ? p.blocks : (p.M + Sh::TOK - 1) / Sh::TOK;  // grouped: one CTA per table block
  kernel<<<dim3(mtiles, p.splits, (p.n16 + kWarps - 1) / kWarps), kThreads, Sh::BYTES, stream>>>(p, staged, ablate);
  return cudaGetLastError();
}

// The launches of one format at every token tile: `extern` in wgmma_ws_gemm.cu (the dispatch), defined in the
// per-format-family translation units (wgmma_ws_fp4.cu, wgmma_ws_fp8.cu, wgmma_ws_q8_0.cu) so the build compiles
// them in parallel.
#define B12X_WGMMA_WS_LAUNCHES(EXT, F)                                                   \
  EXT template cudaError_t launch<F, 8>(const MmaParams&, uint8_t*, int, cudaStream_t);  \
  EXT template cudaError_t launch<F, 16>(const MmaParams&, uint8_t*, int, cudaStream_t); \
  EXT template cudaError_t launch<F, 32>(const MmaParams&, uint8_t*, int, cudaStream_t);

}  // namespace wgmma_ws
}  // namespace b12x
