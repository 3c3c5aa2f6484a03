// Hopper (sm_90a) form of the tensor-core mixed-input GEMM: warpgroup MMAs (wgmma) over the same weight bytes and the
// same argument block (MmaArgs) as mma_gemm.cuh — its 1 KB lane-ordered tiles, decode functors, per-warp weight copies,
// epilogues and split-K reduction are shared, not copied. What differs is the inner product and the activations:
//
//   wgmma.mma_async.sync.aligned.m64n{8·MT}k16.f32.bf16.bf16  d, {a0..a3}, desc_b, 1, 1, 1, 0
//
// - A = the weights, decoded in registers. PTX ISA 9.7.15.5.1.1.1 ("wgmma-64N16-A"): warp w%4 of a warpgroup holds
//   rows 16·(w%4) .. +15 of the 64, its four .b32 registers laid out as mma.sync m16n8k16's A, so warp w decodes row
//   tile 8·blockIdx.z + w exactly as the mma.sync kernel does. Two warpgroups: 128 rows per CTA, as there.
// - D = fp32, TOK/2 per thread; d[4j + e] is (row 16·(w%4) + g + 8·(e/2), token 8j + 2t + (e%2)): per 8 tokens j
//   exactly mma.sync's C fragment, so store_tile (mma_gemm.cuh) writes it.
// - B = the activations (tokens = wgmma's N, 8..128 per CTA) from shared memory, K-major, no swizzle: "core matrices"
//   of 8 tokens × 16 bytes (8 k), 128 contiguous bytes, token r at 16·r (PTX ISA 9.7.15.5.1.2.1.3). The weights'
//   k order is the mma kernel's (lane t's k slots hold its own E elements: step s takes lane elements 4s..4s+3, slots
//   2t, 2t+1 <- 4s, 4s+1 and 8+2t, 9+2t <- 4s+2, 4s+3), so a core matrix row gathers 4-byte pairs from four places of
//   x. stage_x (a small kernel before the GEMM) writes x once per call in exactly the shared-memory order, per chunk
//   and group of 8 tokens a contiguous KB·16-byte block: step s, K half h, token r, lane slot t at byte
//   (2s + h)·128 + 16r + 4t holds x[token, chunk·KB + E·t + 4s + 2h .. +1] (zero past M and K). The GEMM then copies
//   it with plain 16-byte cp.async, and the descriptor of step s starts at s·256 bytes with LBO = 128 (the distance
//   between the K halves' core matrices) and SBO = KB·16 (between token groups).
//
// Pipeline (S stages; each stage holds one K chunk: the token tile's x block and every warp's weight tile):
//   Copies are bulk copies (cp.async.bulk, the TMA engine's 1-D form) completing on the stage's mbarrier: the x block
//   of a chunk is contiguous in `staged` and a warp's weight tile is contiguous in the repack (1 KB of codes, then its
//   16 rows' scale bytes), so lane 0 of each warp issues two or three copies and arrives on the stage's barrier
//   with their byte count (warp 0 adds the x block). No thread computes per-16-byte addresses any more: that was
//   most of the instructions the profile counted (schedulers 56% idle, issue-bound) at 128 tokens.
//   chunk c: wait for stage c%S's barrier (its phase of chunk c); CTA barrier; copy chunk c+S-2 into the stage chunk
//            c-2 used (its wgmmas finished in both warpgroups before the barrier: each waited for all but its newest
//            wgmma group in chunk c-1); decode chunk c's weights from its stage into A set c%2; issue its KB/16
//            wgmmas; wgmma.wait_group 1 (chunk c-1's wgmmas are done, so A set (c+1)%2 may be written next).
// So decoding chunk c overlaps chunk c-1's tensor-core work and S-2 chunks of copies are in flight. Weights are
// streamed with an L2 evict-first policy and x with evict-last: every 128-row block of CTAs re-reads x.
#include "wgmma_common.cuh"

namespace b12x {
namespace wgmma {

static_assert(kWarps == 8, "two warpgroups of four warps");
// Warps (row tiles of 16) a CTA: kWarps (128 rows, two warpgroups), or kWideWarps (256 rows, four warpgroups;
// MmaArgs::tiles 16, FP4 at 64- and 128-token tiles: the plans' FP4 form from wgmma.WIDE_FROM tokens). Why the wide
// form: Nsight Compute on the 128-row form (tools/kernel_profile.sh's ncu_wgmma step, benchmarks/wgmma_profile.py)
// found the tensor pipe busy about half the time at 64-1024 tokens against cuBLAS's 91-95% on the same wgmma count,
// with two warps a scheduler at 128-token tiles (32% issue active): too few warps to hide the decode's latencies. Four warpgroups give four, and each chunk of x feeds twice the rows;
// their registers (128 a thread) fit because they decode and multiply one decode group at a time (below).
constexpr int kWideWarps = MMA_WGMMA_WIDE_TILES;

// CTAs per SM: two up to 64 tokens (16 warps an SM to hide the decode's latencies; 128 registers a thread and at
// most 110 KB of shared memory each), one at 128 tokens (its accumulators alone take 64 registers) or 256 rows.
template <int MT, int W = kWarps>
constexpr int min_blocks() {
  return W == kWarps && MT <= 8 ? 2 : 1;
}
template <class F, int MT>
constexpr int x_stage_bytes() {
  return 8 * MT * F::KB * 2;
}
template <class F, int MT, int W = kWarps>
constexpr int stage_bytes() {
  return x_stage_bytes<F, MT>() + W * slot_bytes<F>();
}
// Stages of the shared-memory ring: as many as fit the CTA's share of the SM beside the IQ2 tables (mma_gemm.cuh's
// table_words, replicated over the banks; none for the other formats), 3..6 (S-2 chunks in flight).
template <class F, int MT, int W = kWarps>
constexpr int stages() {
  constexpr int fit = (220 * 1024 / min_blocks<MT, W>() - table_words<F>() * 4) / stage_bytes<F, MT, W>();
  return fit > 6 ? 6 : fit < 3 ? 3 : fit;
}
template <class F, int MT, int W = kWarps>
constexpr int smem_bytes() {
  return table_words<F>() * 4 + stages<F, MT, W>() * stage_bytes<F, MT, W>();
}

// A dead warp's A registers: zeros (wgmma is collective, so it multiplies them all the same).
template <int N>
__device__ __forceinline__ void zero_a(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int s = 0; s < N; ++s) a[s][0] = a[s][1] = a[s][2] = a[s][3] = 0u;
}

// Groups G0 .. G0+NG-1 of the lane's rows q (codes w0, scale state s0) and q+8 (w1, s1) as A registers: group l gives
// k16 steps 2l and 2l+1 of `a` (PTX's A fragment: rows q, q+8 of the low k half, then of the high half).
template <class F, int G0, int NG, int N>
__device__ __forceinline__ void decode_a(const uint4& w0, const uint4& w1, const typename F::S& s0,
                                         const typename F::S& s1, const uint32_t* tab, int lane, uint32_t (&a)[N][4]) {
  static_assert(N == 2 * NG, "two k16 steps a group");
  static_for<NG>([&](auto L) {
    constexpr int l = decltype(L)::value;
    uint32_t lo[4], hi[4];  // rows q and q+8
    F::template decode8<G0 + l>(w0, s0, tab, lane, lo);
    F::template decode8<G0 + l>(w1, s1, tab, lane, hi);
    a[2 * l][0] = lo[0];
    a[2 * l][1] = hi[0];
    a[2 * l][2] = lo[1];
    a[2 * l][3] = hi[1];
    a[2 * l + 1][0] = lo[2];
    a[2 * l + 1][1] = hi[2];
    a[2 * l + 1][2] = lo[3];
    a[2 * l + 1][3] = hi[3];
  });
}

// Lean chunks: fewer bookkeeping instructions a chunk for the same work, where the kernel is issue-bound (64-token
// tiles: half the cycles issue in Nsight Compute); a few percent faster a layer at 64-4096 tokens, every format
// (`benchmarks/wgmma_linear.py --formats ...` under tools/kernel_ab.sh against the form without). (1) The copies are issued by an
// elect.sync lane instead of `lane == 0`: ptxas then issues each bulk copy once, where under the lane test it wraps
// every one in a loop over the lanes' values (ELECT, BRA.U.ANY: about six instructions a copy). (2) A dead warp's A
// registers are zeroed once before the chunks, not each chunk: the else-branch's zeroing was hoisted above the decode's
// branch, 16 CS2R a chunk on every live warp. (Decoding unconditionally instead let ptxas move the decode past the
// wgmma fence, which serialized the wgmmas: C7513; the branch keeps it before.) (3) With a per-chunk factor, the
// chunk's first wgmma ignores the partial sums' old values (scale-d 0) instead of their being zeroed a chunk. SASS,
// sm_90a, instructions a chunk (64-token tiles): NVFP4 260 -> 235, FP8 164 -> 150, IQ2_XS 665 -> 614, FP8_BLOCK 225 ->
// 210 (7-10% for every format); registers within ±6, no spills, no C7513. The same outputs: the same copies and wgmmas
// (a zero partial sum may keep its sign now; folded into the accumulators, which start at +0, it adds nothing).
// ---------------------------------------------------------------------------------------------- GEMM
// grid (token tiles, or table blocks when GROUPED, K splits, blocks of 16·W rows), as mma_gemm's; W warps.
template <class F, int MT, bool GROUPED = false, int W = kWarps>
__global__ void __launch_bounds__(32 * W, min_blocks<MT, W>()) wgmma_gemm_kernel(const MmaParams p,
                                                                                    const uint8_t* staged) {
#ifdef B12X_WGMMA_DEVICE
  // Grouped, a per-chunk factor must come with each expert's rows (IQ2's d, in the weight stream), not from FP8_BLOCK's
  // 128x128 block-scale grid (a dense weight's).
  static_assert(!(F::ACC && GROUPED) || F::E == 64, "the grouped form's per-chunk factors are IQ2's, per row");
  static_assert(W == kWarps || (W == kWideWarps && !F::ACC && !GROUPED), "256-row CTAs: dense, no per-chunk factor");
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int TOK = 8 * MT, KB = F::KB, E = F::E, S = stages<F, MT, W>();
  constexpr int STEPS = KB / 16;  // k16 steps per chunk (E/4: each takes 4 elements of every lane)
  constexpr int GROUPS = E / 8;   // decode8 groups per chunk: two steps each
  constexpr int XBYTES = x_stage_bytes<F, MT>(), SLOT = slot_bytes<F>();
  static_assert(STEPS == 2 * GROUPS, "two k16 steps per decode group");

  // The warp index through a shuffle from lane 0: the compiler then knows it (and the weight addresses, ring slots and
  // barriers derived from it) warp-uniform, so lane 0's bulk copies take uniform registers as they are.
  const int lane = threadIdx.x & 31, warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), q = lane >> 2, t = lane & 3;
  const int mtile = blockIdx.x, split = blockIdx.y, nblk = blockIdx.z;
  const int c_begin = split * p.chunks_per_split;
  const int c_end = min(p.chunks, c_begin + p.chunks_per_split);
  const int tile_base = nblk * W + warp;  // this warp's row tile (wgmma rows 16·(warp%4) of its warpgroup)
  const bool live = tile_base < p.n16;         // uniform per warp; dead warps feed zeros (wgmma is collective)
  uint32_t* tab = reinterpret_cast<uint32_t*>(smem);  // IQ2's grid and sign tables (mma_gemm.cuh), else nothing
  uint8_t* xring = smem + table_words<F>() * 4;        // S stages of x
  uint8_t* ring = xring + S * XBYTES + warp * S * SLOT;  // this warp's S weight slots
  const uint32_t xring_addr = smem_addr(xring);

  __shared__ int src_row[TOK], dst_row[TOK];
  __shared__ __align__(8) uint64_t full[S];  // stage s holds its chunk: every warp arrived, every byte landed
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) bar_init(&full[s], W);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // Chunk c (the i-th of this split) into stage i % S: lane 0 of each warp copies the warp's weight tile (codes, then
  // its scale bytes; nothing for a dead warp), warp 0 also the token tile's staged x block (only the staged groups:
  // token columns past them are never stored, so whatever the stage held there is harmless), and arrives with the
  // byte count. The weight part and the x part may go out apart (the arrival counts both): the first chunks' weights
  // before the wait for the kernel that staged x (launch.cuh), their x after it.
  const int groups = GROUPED ? p.blocks * MT : (p.M + 7) / 8;  // staged groups of 8 rows (grouped: whole tiles)
  const uint32_t x_bytes = uint32_t(min(XBYTES, max(0, (groups - mtile * MT) * KB * 16)));
  size_t tile_global = tile_base;  // in the stacked weight; grouped: its expert's, from the block table below
  const uint64_t weights_policy = l2_policy_first(), x_policy = l2_policy_last();
  // Addresses computed once (the copy issue is on every chunk's path: 16-20% fewer instructions a chunk than computing
  // them a copy, and faster: benchmarks/wgmma_linear.py): shared-memory addresses as 32-bit offsets (no
  // generic-to-shared conversion a copy), the warp's weight stream as base pointers plus the chunk's offset (set
  // again for the expert when grouped, below).
  const uint32_t ring_addr = smem_addr(ring), full_addr = smem_addr(full);
  const uint8_t* codes_base = p.codes + tile_global * p.chunks * 1024;  // dense; grouped: set after the wait
  const uint8_t* meta_base = p.meta + tile_global * p.chunks * 16 * F::META;
  const uint8_t* meta2_base = p.meta2 + tile_global * p.chunks * 16 * F::META2;  // nothing unless META2
  const uint8_t* x_base = staged + size_t(mtile) * MT * (KB * 16);
  const uint32_t w_bytes = live ? 1024 + 16 * F::META + 16 * F::META2 : 0;
  const uint32_t expect_bytes = w_bytes + (warp == 0 ? x_bytes : 0);
  auto issue_part = [&](int c, bool weights_part, bool x_part) {
    if (c >= c_end || !elect_one()) return;  // every caller's warp is converged here
    const uint32_t stage = unsigned(c - c_begin) % S, bar = full_addr + 8 * stage;
    if (weights_part) {
      fence_proxy_async();
      bar_arrive_expect(bar, expect_bytes);
      if (live) {
        const uint32_t slot = ring_addr + stage * SLOT;
        bulk_copy_to(slot, codes_base + size_t(c) * 1024, 1024, bar, weights_policy);
        if constexpr (F::META > 0)
          bulk_copy_to(slot + 1024, meta_base + size_t(c) * 16 * F::META, 16 * F::META, bar, weights_policy);
        if constexpr (F::META2 > 0)
          bulk_copy_to(slot + 1024 + 16 * F::META, meta2_base + size_t(c) * 16 * F::META2, 16 * F::META2, bar,
                        weights_policy);
      }
    }
    if (x_part && warp == 0 && x_bytes)
      bulk_copy_to(xring_addr + stage * XBYTES, x_base + size_t(c) * groups * (KB * 16), x_bytes, bar, x_policy);
  };
  auto issue = [&](int c) { issue_part(c, true, true); };

  if constexpr (!GROUPED) {
    __syncthreads();  // publishes the initialised mbarriers to the warps' lanes 0
#pragma unroll
    for (int s = 0; s < S - 2; ++s) issue_part(c_begin + s, true, false);
  }
  // IQ2's tables (dense and grouped), after a dense tile's first weights went out; begin_chunk's barrier publishes
  // them.
  if constexpr (table_words<F>() > 0) fill_tables<F, 32 * W>(tab, p.tables);
  grid_dependency_wait();
  const int expert = tile_rows<TOK>(p, mtile, src_row, dst_row);  // its barrier publishes the initialised mbarriers
  if (expert < 0) return;
  tile_global = size_t(expert) * p.n16 + tile_base;
  codes_base = p.codes + tile_global * p.chunks * 1024;
  meta_base = p.meta + tile_global * p.chunks * 16 * F::META;
  meta2_base = p.meta2 + tile_global * p.chunks * 16 * F::META2;

  float acc[1][MT][4];
  float(&d)[TOK / 2] = reinterpret_cast<float(&)[TOK / 2]>(acc[0]);
#pragma unroll
  for (int i = 0; i < TOK / 2; ++i) d[i] = 0.f;

  using Sc = typename F::S;
#pragma unroll
  for (int s = 0; s < S - 2; ++s) issue_part(c_begin + s, GROUPED, true);  // dense: the weights went out above
  // Chunk c's stage once its copies have landed; past the CTA barrier every warp is done with chunk c-2, whose stage
  // then takes chunk c+S-2's copies (see the header).
  auto begin_chunk = [&](int c) {
    const unsigned i = unsigned(c - c_begin), stage = i % S;
    bar_wait(&full[stage], (i / S) & 1);
    __syncthreads();
    issue(c + S - 2);
    return stage;
  };
  // chunk(c, P) over the split's chunks in order, P (the A register set, (c - c_begin) % 2) a constant.
  auto for_chunks = [&](auto&& chunk) {
    for (int c = c_begin; c < c_end; c += 2) {
      chunk(c, std::integral_constant<int, 0>{});
      if (c + 1 < c_end) chunk(c + 1, std::integral_constant<int, 1>{});
    }
  };
  if constexpr (!F::ACC) {
    // Chunk c on A register set P (c % 2 = P): see the header for why each step sits where it does.
    uint32_t a[2][STEPS][4];
    zero_a(a[0]);  // once: a dead warp (rows past N) multiplies zeros in every chunk, a live one its decode
    zero_a(a[1]);
    for_chunks([&](int c, auto P) {
      const unsigned stage = begin_chunk(c);
      const uint32_t xs = xring_addr + stage * XBYTES;
      const uint64_t desc0 = smem_desc<KB * 16>(xs);  // step s starts 256 bytes on: its address field (bytes / 16) + 16·s
      // the lane's codes of rows q and q + 8 and their scales; a dead warp's: zero codes at a zero scale, zeros
      uint4 w0 = make_uint4(0, 0, 0, 0), w1 = w0;
      Sc s0{}, s1{};
      if (live) {
        const uint8_t* slot = ring + stage * SLOT;
        w0 = *reinterpret_cast<const uint4*>(slot + 16 * lane);
        w1 = *reinterpret_cast<const uint4*>(slot + 512 + 16 * lane);
        s0 = F::scale(slot + 1024 + q * F::META, nullptr, t, w0, p.scale_mul);
        s1 = F::scale(slot + 1024 + (8 + q) * F::META, nullptr, t, w1, p.scale_mul);
      }
      if constexpr (W == kWarps) {
        constexpr int par = decltype(P)::value;
        if (live) decode_a<F, 0, GROUPS>(w0, w1, s0, s1, nullptr, lane, a[par]);  // a dead warp's stay zero
        fence_operands(d);
        wg_fence();  // orders the A registers just written (and the accumulators) before the wgmmas read them
        static_for<STEPS>([&](auto St) {
          constexpr int s = decltype(St)::value;
          mma_async<TOK>(d, a[par][s], desc0 + uint64_t(16 * s));
        });
        wg_commit();
        wg_wait<1>();
      } else {
        // 256-row CTAs (128 registers a thread): one decode group (two k16 steps) at a time, its two wgmmas a group
        // of their own, the group before waited for before the next decode (ptxas serializes every wgmma of a group
        // whose A registers are written while it is in flight: C7513); 8 registers of A instead of 64. (With two
        // warpgroups this form gains nothing over the whole chunk, within a few percent either way.)
        fence_operands(d);
        static_for<GROUPS>([&](auto Gc) {
          constexpr int g = decltype(Gc)::value;
          uint32_t ag[2][4];  // steps 2g and 2g + 1
          decode_a<F, g, 1>(w0, w1, s0, s1, nullptr, lane, ag);
          wg_fence();
          mma_async<TOK>(d, ag[0], desc0 + uint64_t(32 * g));
          mma_async<TOK>(d, ag[1], desc0 + uint64_t(32 * g + 16));
          wg_commit();
          wg_wait<1>();
        });
      }
      fence_operands(d);
    });
    wg_wait<0>();
    fence_operands(d);
  } else {
    // A per-chunk fp32 factor (FP8_BLOCK's 128×128 block scale, IQ2's fp16 d per row and 256 k), as the mma.sync
    // kernel applies it: chunk c's wgmmas sum into `part` (zeroed first), which is folded into d times the factor of
    // each of the lane's two rows (d[4j + e]: row q for e < 2, q + 8 otherwise) once they are done, while chunk c+1
    // is decoded. The chunk goes in units of U k16 steps on alternating A register sets (IQ2's 16 steps at once
    // would take 128 registers of A; units of four spilled at 64-token tiles, whose two accumulator sets take 64
    // registers, so two there: no spills, by ptxas), each unit's wgmmas one group: the wait for all but the newest
    // group after a unit's commit frees the set the next unit writes; the wait for all before the fold, its factors'
    // chunk.
    constexpr int U = STEPS <= 4 ? STEPS : (MT >= 8 ? 2 : 4), UNITS = STEPS / U;
    static_assert(STEPS % U == 0 && U % 2 == 0 && (UNITS == 1 || UNITS % 2 == 0), "whole groups, sets alternate");
    const int kblocks = (p.K + 127) / 128;
    float part[TOK / 2];
#pragma unroll
    for (int j = 0; j < TOK / 2; ++j) part[j] = 0.f;
    float factor[2] = {0.f, 0.f};  // the last chunk's, for rows q and q + 8
    uint32_t a[2][U][4];
    zero_a(a[0]);  // once: a dead warp multiplies zeros in every unit, a live one its decode
    zero_a(a[1]);
    auto fold = [&]() {
#pragma unroll
      for (int i = 0; i < TOK / 2; ++i) d[i] += factor[(i >> 1) & 1] * part[i];
    };
    for_chunks([&](int c, auto P) {
      constexpr int par = decltype(P)::value;
      const unsigned stage = begin_chunk(c);
      const uint8_t* slot = ring + stage * SLOT;
      const uint8_t* m = slot + 1024;
      const uint8_t* m2 = m + 16 * F::META;
      uint4 w0 = make_uint4(0, 0, 0, 0), w1 = w0;
      Sc s0{}, s1{};
      float f0 = 0.f, f1 = 0.f;  // dead warps: zero A, so zero parts
      if (live) {
        w0 = *reinterpret_cast<const uint4*>(slot + 16 * lane);
        w1 = *reinterpret_cast<const uint4*>(slot + 512 + 16 * lane);
        s0 = F::scale(m + q * F::META, m2 + q * F::META2, t, w0, p.scale_mul);
        s1 = F::scale(m + (8 + q) * F::META, m2 + (8 + q) * F::META2, t, w1, p.scale_mul);
        if constexpr (F::E == 64) {
          f0 = F::acc_scale(m + q * F::META);
          f1 = F::acc_scale(m + (8 + q) * F::META);
        } else {  // one scale for the CTA's 128 rows (a 128-row block) and the chunk's 128-wide k block
          f0 = f1 = __ldg(p.block_scale + (tile_global / 8) * kblocks + (c * KB) / 128);
        }
      }
      const uint64_t desc0 = smem_desc<KB * 16>(xring_addr + stage * XBYTES);
      static_for<UNITS>([&](auto Un) {
        constexpr int u = decltype(Un)::value, set = UNITS == 1 ? par : u % 2;
        if (live) decode_a<F, u * U / 2, U / 2>(w0, w1, s0, s1, tab, lane, a[set]);  // a dead warp's stay zero
        if constexpr (u == 0) {  // the last chunk's wgmmas are done: fold them, start this chunk's sum
          wg_wait<0>();
          fence_operands(part);
          if (c > c_begin) fold();
          factor[0] = f0;
          factor[1] = f1;
        }
        fence_operands(part);
        wg_fence();  // orders the A registers just written (and part) before the wgmmas read them
        static_for<U>([&](auto St) {
          constexpr int s = u * U + decltype(St)::value;
          mma_async<TOK>(part, a[set][s - u * U], desc0 + uint64_t(16 * s), s == 0 ? 0u : 1u);
        });
        wg_commit();
        wg_wait<1>();
        fence_operands(part);
      });
    });
    wg_wait<0>();
    fence_operands(part);
    if (c_begin < c_end) fold();
  }
  grid_dependents_launch();  // the next kernel may start its weight copies while this one stores

  store_tile<1, MT>(p, acc, tile_base, expert, split, mtile, nblk, dst_row);
#endif  // B12X_WGMMA_DEVICE
}

template <class F, int MT, int W = kWarps>
cudaError_t launch(const MmaParams& p, uint8_t* staged, cudaStream_t stream) {
  constexpr int bytes = smem_bytes<F, MT, W>();
  static_assert(bytes <= 227 * 1024, "shared memory of one CTA");
  const bool grouped = p.order != nullptr;
  if (W != kWarps && grouped) return cudaErrorInvalidValue;  // 256-row CTAs are dense (module.cpp refuses it first)
  constexpr bool kGroups = MT >= 4 && W == kWarps && (!F::ACC || F::E == 64);  // 32-128-token tiles, no FP8_BLOCK
  if constexpr (!kGroups) {
    if (grouped) return cudaErrorInvalidValue;
  }
  const int groups = grouped ? p.blocks * MT : (p.M + 7) / 8;
  const long long pieces = (long long)groups * 8 * p.chunks * (F::KB / 8);
  const unsigned stage_blocks = unsigned((pieces + 255) / 256);
  cudaError_t err = grouped ? launch_kernel(p.pdl, stage_x_grouped_kernel<F>, dim3(stage_blocks), dim3(256), 0, stream,
                                            p, staged, groups, 8 * MT)
                            : launch_kernel(p.pdl, stage_x_kernel<F>, dim3(stage_blocks), dim3(256), 0, stream, p.x,
                                            staged, p.M, p.K, p.chunks, groups);
  if (err != cudaSuccess) return err;
  auto kernel = wgmma_gemm_kernel<F, MT, false, W>;
  if constexpr (kGroups) {
    if (grouped) kernel = wgmma_gemm_kernel<F, MT, true>;
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  const int mtiles = grouped ? p.blocks : (p.M + 8 * MT - 1) / (8 * MT);  // grouped: one CTA per table block
  return launch_kernel(p.pdl, kernel, dim3(mtiles, p.splits, (p.n16 + W - 1) / W), dim3(32 * W), bytes, stream, p,
                       staged);
}

template <class F, int MT>
int blocks_per_sm() {  // 0 where it cannot run here (launch.cuh blocks_per_sm_of)
  return blocks_per_sm_of(wgmma_gemm_kernel<F, MT>, 32 * kWarps, smem_bytes<F, MT>());
}

// The formats with a per-chunk fp32 factor (F::ACC: FP8_BLOCK, IQ2_XS, IQ2_XXS), which this kernel runs at token
// tiles up to 64 (IQ2_XS's tables and 128-token stages would not fit shared memory). Grouped (an MoE's experts) only
// IQ2, at 32- and 64-slot blocks. tests/kernels/test_wgmma_gemm.py holds both to the reference and the mma.sync
// kernel.
template <class R, class Fn>
R with_factor_format(int format, R fallback, Fn&& fn) {
  switch (format) {
    case FMT_FP8_BLOCK: return fn(FmtFP8Block{});
    case FMT_IQ2_XS: return fn(FmtIQ2<true>{});
    case FMT_IQ2_XXS: return fn(FmtIQ2<false>{});
    default: return fallback;
  }
}
bool factor_format(int format) {
  return with_factor_format(format, false, [](auto) { return true; });
}

// fn(F{}, std::integral_constant<int, MT>{}) for the formats and token tiles this kernel runs, `fallback` for others.
template <class R, class Fn>
R with_config(int format, int mt, R fallback, Fn&& fn) {
  auto tiles = [&](auto f) -> R {
    switch (mt) {
      case 1: return fn(f, std::integral_constant<int, 1>{});
      case 2: return fn(f, std::integral_constant<int, 2>{});
      case 4: return fn(f, std::integral_constant<int, 4>{});
      case 8: return fn(f, std::integral_constant<int, 8>{});
      case 16:
        if constexpr (decltype(f)::ACC) return fallback;
        else return fn(f, std::integral_constant<int, 16>{});
      default: return fallback;
    }
  };
  if (factor_format(format)) return with_factor_format(format, fallback, tiles);
  return with_wgmma_format(format, fallback, tiles);
}

// fn(F{}, std::integral_constant<int, MT>{}) for the formats and token tiles of the 256-row form (MmaArgs::tiles 16:
// FP4, whose 128-wide chunks amortize a CTA's copies and barriers best, at the token tiles that run one CTA an SM),
// `fallback` for others.
template <class R, class Fn>
R with_wide_config(int format, int mt, R fallback, Fn&& fn) {
  auto tiles = [&](auto f) -> R {
    switch (mt) {
      case 8: return fn(f, std::integral_constant<int, 8>{});
      case 16: return fn(f, std::integral_constant<int, 16>{});
      default: return fallback;
    }
  };
  switch (format) {
    case FMT_NVFP4: return tiles(FmtFP4<true>{});
    case FMT_MXFP4: return tiles(FmtFP4<false>{});
    default: return fallback;
  }
}

// The device runs sm_90a code (compute capability 9.0 exactly), asked once per device.
bool on_sm90(int device) {
  static int known[64] = {};  // 0 unknown, 1 yes, 2 no
  if (device < 0 || device >= 64) return false;
  if (!known[device]) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    known[device] = major == 9 && minor == 0 ? 1 : 2;
  }
  return known[device] == 1;
}

}  // namespace wgmma

const char* wgmma_args_error(const MmaArgs& p) {
  using namespace wgmma;
  const int ck = with_config(p.format, 1, 0, [](auto f, auto) { return decltype(f)::KB; });
  if (!ck) return "wgmma_gemm: format must be FP8, FP8_BLOCK, MXFP8, NVFP4, MXFP4, Q8_0, IQ2_XS or IQ2_XXS";
  if (p.resident) return "wgmma_gemm: resident activations are mma_gemm's (one-token tiles)";
  if (p.x_quant) return "wgmma_gemm: activations quantized in the kernel are mma_gemm's (resident)";
  if (p.N < 1 || p.K < 8 || p.K % 8) return "wgmma_gemm: need N >= 1 and K % 8 == 0";
  if (p.chunks < 1 || p.chunks * ck < p.K) return "wgmma_gemm: the repacked weight covers fewer than K columns";
  if (p.rt != 1) return "wgmma_gemm: rt must be 1 (a warp decodes one row tile)";
  if (factor_format(p.format) && !with_config(p.format, p.mt, 0, [](auto, auto) { return 1; }))
    return "wgmma_gemm: FP8_BLOCK and IQ2 run mt 1, 2, 4 or 8";
  if (!with_config(p.format, p.mt, 0, [](auto, auto) { return 1; })) return "wgmma_gemm: mt must be 1, 2, 4, 8 or 16";
  if (p.splits < 1 || p.splits > p.chunks) return "wgmma_gemm: splits must be in 1..chunks";
  if (p.tiles != kWarps &&
      !(p.tiles == kWideWarps && with_wide_config(p.format, p.mt, false, [](auto, auto) { return true; })))
    return "wgmma_gemm: tiles must be 8, or 16 (256-row CTAs) for NVFP4 / MXFP4 at mt 8 or 16";
  if (p.epilogue < MMA_OUT_BF16 || p.epilogue > MMA_OUT_F32) return "wgmma_gemm: unknown epilogue";
  if (p.epilogue == MMA_OUT_SILU && p.N % 16) return "wgmma_gemm: silu needs N % 16 == 0 (8 gate, 8 up rows per tile)";
  if (p.ldy < p.N && p.epilogue != MMA_OUT_SILU && p.epilogue != MMA_OUT_F32) return "wgmma_gemm: need ldy >= N";
  if (!p.codes || reinterpret_cast<uintptr_t>(p.codes) % 16) return "wgmma_gemm: null or misaligned codes";
  const int meta = with_config(p.format, 1, 0, [](auto f, auto) { return decltype(f)::META; });
  if (meta && !p.meta) return "wgmma_gemm: this format needs its block scales (meta)";
  if (p.format == FMT_IQ2_XS && !p.meta2) return "wgmma_gemm: IQ2_XS needs its sub-block scales (meta2)";
  if ((p.format == FMT_IQ2_XS || p.format == FMT_IQ2_XXS) && !p.tables) return "wgmma_gemm: IQ2 needs its grid tables";
  if (p.format == FMT_FP8_BLOCK && !p.block_scale) return "wgmma_gemm: FP8_BLOCK needs its block scales";
  return nullptr;
}

int wgmma_blocks_per_sm(int format, int mt) {
  using namespace wgmma;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || !on_sm90(device)) return 0;
  return with_config(format, mt, 0, [](auto f, auto m) { return blocks_per_sm<decltype(f), decltype(m)::value>(); });
}

cudaError_t wgmma_gemm(const MmaArgs& args, const MmaCall& call, uint8_t* staged, cudaStream_t stream) {
  using namespace wgmma;
  if (wgmma_args_error(args) || call.M < 1 || !call.x || !staged) return cudaErrorInvalidValue;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (!on_sm90(device)) return cudaErrorNoKernelImageForDevice;  // sm_90a code runs on 9.0 only
  MmaParams p{};
  static_cast<MmaArgs&>(p) = args;
  static_cast<MmaCall&>(p) = call;
  p.n16 = (args.N + 15) / 16;
  p.chunks_per_split = (args.chunks + args.splits - 1) / args.splits;
  if (call.order) {
    p.block_expert = call.table;
    p.block_start = call.table + call.blocks;
    p.block_rows = call.table + 2 * size_t(call.blocks);
  }
  if (args.tiles == kWideWarps)
    return with_wide_config(args.format, args.mt, cudaErrorInvalidValue, [&](auto f, auto m) {
      return launch<decltype(f), decltype(m)::value, kWideWarps>(p, staged, stream);
    });
  return with_config(args.format, args.mt, cudaErrorInvalidValue,
                     [&](auto f, auto m) { return launch<decltype(f), decltype(m)::value>(p, staged, stream); });
}

}  // namespace b12x
