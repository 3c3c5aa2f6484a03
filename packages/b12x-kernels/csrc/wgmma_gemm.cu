// Hopper (sm_90a) form of the tensor-core mixed-input GEMM: warpgroup MMAs (wgmma) over the same weight bytes and the
// same argument block (MmaPlan) as mma_gemm.cuh — its 1 KB lane-ordered tiles, decode functors, per-warp weight copies,
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
#include "mma_gemm.cuh"

// The kernel bodies exist only in the sm_90a pass: wgmma is an sm_90a instruction. Other passes (sm_120a, sm_121a)
// compile empty kernels, and the host entry refuses to launch on anything but a 9.0 device.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define B12X_WGMMA_DEVICE 1
#endif

namespace b12x {
namespace wgmma {
using namespace mma;  // decode functors, MmaParams, tile_rows, WeightStream, store_tile

constexpr int kThreads = 32 * kWarps;
static_assert(kWarps == 8, "two warpgroups of four warps");

// CTAs per SM: two up to 64 tokens (16 warps an SM to hide the decode's latencies; 128 registers a thread and at
// most 110 KB of shared memory each), one at 128 tokens (its accumulators alone take 64 registers).
template <int MT>
constexpr int min_blocks() {
  return MT <= 8 ? 2 : 1;
}
template <class F, int MT>
constexpr int x_stage_bytes() {
  return 8 * MT * F::KB * 2;
}
template <class F, int MT>
constexpr int stage_bytes() {
  return x_stage_bytes<F, MT>() + kWarps * slot_bytes<F>();
}
// Stages of the shared-memory ring: as many as fit the CTA's share of the SM, 3..6 (S-2 chunks in flight).
template <class F, int MT>
constexpr int stages() {
  constexpr int fit = (220 * 1024 / min_blocks<MT>()) / stage_bytes<F, MT>();
  return fit > 6 ? 6 : fit < 3 ? 3 : fit;
}
template <class F, int MT>
constexpr int smem_bytes() {
  return stages<F, MT>() * stage_bytes<F, MT>();
}

#ifdef B12X_WGMMA_DEVICE
// ---------------------------------------------------------------------------------------------- wgmma helpers
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void bar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// One arrival on the stage's barrier that also raises its expected transaction bytes by `bytes` (0: a plain arrival).
__device__ __forceinline__ void bar_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
}
// L2 policies: evict_first for bytes read once (the weights), evict_last for bytes every row block re-reads (x).
__device__ __forceinline__ uint64_t l2_policy_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint64_t l2_policy_last() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global to this CTA's shared memory; completes on bar.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(pol)
      : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the wgmma fences (CUTLASS's
// warpgroup_fence_operand).
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ uint64_t desc_field(uint32_t bytes) { return (bytes & 0x3FFFFu) >> 4; }
// K-major, no swizzle, base offset 0 (PTX ISA 9.7.15.5.1.2.2): start address | LBO << 16 | SBO << 32.
template <uint32_t SBO>
__device__ __forceinline__ uint64_t smem_desc(uint32_t smem_addr) {
  return desc_field(smem_addr) | (desc_field(128) << 16) | (desc_field(SBO) << 32);
}

// d += A (64 × 16 bf16, registers) · B (16 × N bf16, shared memory through desc), N = 8·NT; scale-d = 1,
// imm-scale-a = imm-scale-b = 1, imm-trans-b = 0 (K-major). Written out per N (the asm needs N/2 operands).
template <int N>
__device__ void mma_async(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc);

template <>
__device__ __forceinline__ void mma_async<8>(float (&d)[4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3"
      "}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}

template <>
__device__ __forceinline__ void mma_async<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}

template <>
__device__ __forceinline__ void mma_async<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}

template <>
__device__ __forceinline__ void mma_async<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}

template <>
__device__ __forceinline__ void mma_async<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}
#endif  // B12X_WGMMA_DEVICE

// ---------------------------------------------------------------------------------------------- stage_x
// x [M, K] (row stride K) -> staged[chunk][group of 8 tokens][KB·16 bytes] in the B operand's shared-memory order
// (the header). One thread per 16-byte piece of x (token m, chunk c, lane slot t, elements 8j..8j+7 of the slot's E):
// a coalesced load, its four 4-byte pairs to steps 2j' and 2j'+1 (j' = j within the slot), K halves 0 and 1.
template <class F>
__global__ void stage_x_kernel(const __nv_bfloat16* __restrict__ x, uint8_t* __restrict__ staged, int M, int K,
                               int chunks, int groups) {
#ifdef B12X_WGMMA_DEVICE
  constexpr int KB = F::KB, E = F::E, PIECES = KB / 8;  // 16-byte pieces per token and chunk
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= (long long)groups * 8 * chunks * PIECES) return;
  const int pc = int(i % PIECES);
  const long long rest = i / PIECES;
  const int m = int(rest % (groups * 8)), c = int(rest / (groups * 8));
  const int e0 = 8 * pc, t = e0 / E, s0 = (e0 % E) / 4, k = c * KB + e0;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (m < M && k < K) v = __ldg(reinterpret_cast<const uint4*>(x + size_t(m) * K + k));
  uint8_t* block = staged + (size_t(c) * groups + m / 8) * (KB * 16) + 16 * (m % 8) + 4 * t;
  *reinterpret_cast<uint32_t*>(block + (2 * s0 + 0) * 128) = v.x;
  *reinterpret_cast<uint32_t*>(block + (2 * s0 + 1) * 128) = v.y;
  *reinterpret_cast<uint32_t*>(block + (2 * s0 + 2) * 128) = v.z;
  *reinterpret_cast<uint32_t*>(block + (2 * s0 + 3) * 128) = v.w;
#endif
}

// The grouped form's staging (a fused MoE's GEMMs): staged row R is row r = R % TOK of table block b = R / TOK, the
// input row of its slot (slot / top_k, or the slot itself), zero past the block's slot count and for idle blocks;
// otherwise as stage_x_kernel. Written apart from it so the linear form's code stays the code the H200 ran.
template <class F>
__global__ void stage_x_grouped_kernel(const MmaParams p, uint8_t* __restrict__ staged, int groups, int tok) {
#ifdef B12X_WGMMA_DEVICE
  constexpr int KB = F::KB, E = F::E, PIECES = KB / 8;
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= (long long)groups * 8 * p.chunks * PIECES) return;
  const int pc = int(i % PIECES);
  const long long rest = i / PIECES;
  const int row = int(rest % (groups * 8)), c = int(rest / (groups * 8));
  const int e0 = 8 * pc, t = e0 / E, s0 = (e0 % E) / 4, k = c * KB + e0;
  const int b = row / tok, r = row % tok;
  int src = -1;
  if (p.block_expert[b] >= 0 && r < p.block_rows[b]) {
    const int slot = p.order[p.block_start[b] + r];
    src = p.top_k ? slot / p.top_k : slot;
  }
  uint4 v = make_uint4(0, 0, 0, 0);
  if (src >= 0 && k < p.K) v = __ldg(reinterpret_cast<const uint4*>(p.x + size_t(src) * p.K + k));
  uint8_t* block = staged + (size_t(c) * groups + row / 8) * (KB * 16) + 16 * (row % 8) + 4 * t;
  *reinterpret_cast<uint32_t*>(block + (2 * s0 + 0) * 128) = v.x;
  *reinterpret_cast<uint32_t*>(block + (2 * s0 + 1) * 128) = v.y;
  *reinterpret_cast<uint32_t*>(block + (2 * s0 + 2) * 128) = v.z;
  *reinterpret_cast<uint32_t*>(block + (2 * s0 + 3) * 128) = v.w;
#endif
}

// ---------------------------------------------------------------------------------------------- GEMM
// grid (token tiles, or table blocks when GROUPED, K splits, 128-row blocks), as mma_gemm's.
template <class F, int MT, bool GROUPED = false>
__global__ void __launch_bounds__(kThreads, min_blocks<MT>()) wgmma_gemm_kernel(const MmaParams p,
                                                                                   const uint8_t* staged) {
#ifdef B12X_WGMMA_DEVICE
  static_assert(!F::ACC, "a per-chunk fp32 scale needs partial accumulators, which this kernel does not keep");
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int TOK = 8 * MT, KB = F::KB, E = F::E, S = stages<F, MT>();
  constexpr int STEPS = KB / 16;  // k16 steps per chunk (E/4: each takes 4 elements of every lane)
  constexpr int GROUPS = E / 8;   // decode8 groups per chunk: two steps each
  constexpr int XBYTES = x_stage_bytes<F, MT>(), SLOT = slot_bytes<F>();
  static_assert(STEPS == 2 * GROUPS, "two k16 steps per decode group");

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane >> 2, t = lane & 3;
  const int mtile = blockIdx.x, split = blockIdx.y, nblk = blockIdx.z;
  const int c_begin = split * p.chunks_per_split;
  const int c_end = min(p.chunks, c_begin + p.chunks_per_split);
  const int tile_base = nblk * kWarps + warp;  // this warp's row tile (wgmma rows 16·(warp%4) of its warpgroup)
  const bool live = tile_base < p.n16;         // uniform per warp; dead warps feed zeros (wgmma is collective)
  uint8_t* xring = smem;                       // S stages of x
  uint8_t* ring = smem + S * XBYTES + warp * S * SLOT;  // this warp's S weight slots
  const uint32_t xring_addr = smem_addr(xring);

  __shared__ int src_row[TOK], dst_row[TOK];
  __shared__ __align__(8) uint64_t full[S];  // stage s holds its chunk: every warp arrived, every byte landed
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) bar_init(&full[s], kWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  const int expert = tile_rows<TOK>(p, mtile, src_row, dst_row);  // its barrier publishes the initialised mbarriers
  if (expert < 0) return;
  const size_t tile_global = size_t(expert) * p.n16 + tile_base;

  // Chunk c (the i-th of this split) into stage i % S: lane 0 of each warp copies the warp's weight tile (codes, then
  // its scale bytes; nothing for a dead warp), warp 0 also the token tile's staged x block (only the staged groups:
  // token columns past them are never stored, so whatever the stage held there is harmless), and arrives with the
  // byte count.
  const int groups = GROUPED ? p.blocks * MT : (p.M + 7) / 8;  // staged groups of 8 rows (grouped: whole tiles)
  const uint32_t x_bytes = uint32_t(min(XBYTES, max(0, (groups - mtile * MT) * KB * 16)));
  const uint8_t* codes = p.codes + tile_global * p.chunks * 1024;
  const uint8_t* meta = F::META ? p.meta + tile_global * p.chunks * 16 * F::META : nullptr;
  const uint64_t weights_policy = l2_policy_first(), x_policy = l2_policy_last();
  auto issue = [&](int c) {
    if (c >= c_end || lane != 0) return;
    const int stage = unsigned(c - c_begin) % S;
    uint64_t* bar = &full[stage];
    const uint32_t w_bytes = live ? 1024 + 16 * F::META : 0;
    const uint32_t bytes = w_bytes + (warp == 0 ? x_bytes : 0);
    fence_proxy_async();  // the stage's earlier generic reads (weights, two chunks ago) before the async writes
    bar_arrive_expect(bar, bytes);
    if (warp == 0 && x_bytes)
      bulk_copy(xring + stage * XBYTES, staged + (size_t(c) * groups + size_t(mtile) * MT) * (KB * 16), x_bytes, bar,
                x_policy);
    if (live) {
      uint8_t* slot = ring + stage * SLOT;
      bulk_copy(slot, codes + size_t(c) * 1024, 1024, bar, weights_policy);
      if constexpr (F::META > 0) bulk_copy(slot + 1024, meta + size_t(c) * 16 * F::META, 16 * F::META, bar, weights_policy);
    }
  };

  float acc[1][MT][4];
  float(&d)[TOK / 2] = reinterpret_cast<float(&)[TOK / 2]>(acc[0]);
#pragma unroll
  for (int i = 0; i < TOK / 2; ++i) d[i] = 0.f;

  // Chunk c on A register set P (c % 2 = P): see the header for why each step sits where it does.
  uint32_t a[2][STEPS][4];
  using Sc = typename F::S;
  auto chunk = [&](int c, auto P) {
    constexpr int par = decltype(P)::value;
    const unsigned i = unsigned(c - c_begin), stage = i % S;
    bar_wait(&full[stage], (i / S) & 1);
    __syncthreads();
    issue(c + S - 2);
    if (live) {
      const uint8_t* slot = ring + stage * SLOT;
      const uint4 w0 = *reinterpret_cast<const uint4*>(slot + 16 * lane);
      const uint4 w1 = *reinterpret_cast<const uint4*>(slot + 512 + 16 * lane);
      const Sc s0 = F::scale(slot + 1024 + q * F::META, nullptr, t, w0, p.scale_mul);
      const Sc s1 = F::scale(slot + 1024 + (8 + q) * F::META, nullptr, t, w1, p.scale_mul);
      static_for<GROUPS>([&](auto G) {
        constexpr int g = decltype(G)::value;
        uint32_t lo[4], hi[4];  // rows q and q+8
        F::template decode8<g>(w0, s0, nullptr, lane, lo);
        F::template decode8<g>(w1, s1, nullptr, lane, hi);
        a[par][2 * g][0] = lo[0];
        a[par][2 * g][1] = hi[0];
        a[par][2 * g][2] = lo[1];
        a[par][2 * g][3] = hi[1];
        a[par][2 * g + 1][0] = lo[2];
        a[par][2 * g + 1][1] = hi[2];
        a[par][2 * g + 1][2] = lo[3];
        a[par][2 * g + 1][3] = hi[3];
      });
    } else {
#pragma unroll
      for (int s = 0; s < STEPS; ++s) a[par][s][0] = a[par][s][1] = a[par][s][2] = a[par][s][3] = 0u;
    }
    fence_operands(d);
    wg_fence();  // orders the A registers just written (and the accumulators) before the wgmmas read them
    const uint32_t xs = xring_addr + stage * XBYTES;
    static_for<STEPS>([&](auto St) {
      constexpr int s = decltype(St)::value;
      mma_async<TOK>(d, a[par][s], smem_desc<KB * 16>(xs + s * 256));
    });
    wg_commit();
    wg_wait<1>();
    fence_operands(d);
  };

#pragma unroll
  for (int s = 0; s < S - 2; ++s) issue(c_begin + s);
  for (int c = c_begin; c < c_end; c += 2) {
    chunk(c, std::integral_constant<int, 0>{});
    if (c + 1 < c_end) chunk(c + 1, std::integral_constant<int, 1>{});
  }
  wg_wait<0>();
  fence_operands(d);

  store_tile<1, MT>(p, acc, tile_base, expert, split, mtile, nblk, dst_row);
#endif  // B12X_WGMMA_DEVICE
}

template <class F, int MT>
cudaError_t launch(const MmaParams& p, uint8_t* staged, cudaStream_t stream) {
  constexpr int bytes = smem_bytes<F, MT>();
  static_assert(bytes <= 227 * 1024, "shared memory of one CTA");
  const bool grouped = p.order != nullptr;
  if constexpr (MT < 4) {
    if (grouped) return cudaErrorInvalidValue;  // the grouped form is built for 32-128-token tiles only
  }
  const int groups = grouped ? p.blocks * MT : (p.M + 7) / 8;
  const long long pieces = (long long)groups * 8 * p.chunks * (F::KB / 8);
  const unsigned stage_blocks = unsigned((pieces + 255) / 256);
  if (grouped) {
    stage_x_grouped_kernel<F><<<stage_blocks, 256, 0, stream>>>(p, staged, groups, 8 * MT);
  } else {
    stage_x_kernel<F><<<stage_blocks, 256, 0, stream>>>(p.x, staged, p.M, p.K, p.chunks, groups);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  auto kernel = wgmma_gemm_kernel<F, MT, false>;
  if constexpr (MT >= 4) {
    if (grouped) kernel = wgmma_gemm_kernel<F, MT, true>;
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  const int mtiles = grouped ? p.blocks : (p.M + 8 * MT - 1) / (8 * MT);  // grouped: one CTA per table block
  kernel<<<dim3(mtiles, p.splits, (p.n16 + kWarps - 1) / kWarps), kThreads, bytes, stream>>>(p, staged);
  return cudaGetLastError();
}

template <class F, int MT>
int blocks_per_sm() {
  auto kernel = wgmma_gemm_kernel<F, MT>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<F, MT>()) != cudaSuccess)
    return 0;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem_bytes<F, MT>()) != cudaSuccess)
    return 0;
  return blocks;
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
      case 16: return fn(f, std::integral_constant<int, 16>{});
      default: return fallback;
    }
  };
  switch (format) {
    case FMT_FP8: return tiles(FmtFP8{});
    case FMT_MXFP8: return tiles(FmtMXFP8{});
    case FMT_NVFP4: return tiles(FmtFP4<true>{});
    case FMT_MXFP4: return tiles(FmtFP4<false>{});
    case FMT_Q8_0: return tiles(FmtQ8_0{});
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

const char* wgmma_plan_error(const MmaPlan& p) {
  using namespace wgmma;
  const int ck = with_config(p.format, 1, 0, [](auto f, auto) { return decltype(f)::KB; });
  if (!ck) return "wgmma_gemm: format must be FP8, MXFP8, NVFP4, MXFP4 or Q8_0 (no per-chunk fp32 scale)";
  if (p.N < 1 || p.K < 8 || p.K % 8) return "wgmma_gemm: need N >= 1 and K % 8 == 0";
  if (p.chunks < 1 || p.chunks * ck < p.K) return "wgmma_gemm: the repacked weight covers fewer than K columns";
  if (!with_config(p.format, p.mt, 0, [](auto, auto) { return 1; })) return "wgmma_gemm: mt must be 1, 2, 4, 8 or 16";
  if (p.rt != 1) return "wgmma_gemm: rt must be 1 (a warp decodes one row tile)";
  if (p.splits < 1 || p.splits > p.chunks) return "wgmma_gemm: splits must be in 1..chunks";
  if (p.epilogue < MMA_OUT_BF16 || p.epilogue > MMA_OUT_F32) return "wgmma_gemm: unknown epilogue";
  if (p.epilogue == MMA_OUT_SILU && p.N % 16) return "wgmma_gemm: silu needs N % 16 == 0 (8 gate, 8 up rows per tile)";
  if (p.ldy < p.N && p.epilogue != MMA_OUT_SILU && p.epilogue != MMA_OUT_F32) return "wgmma_gemm: need ldy >= N";
  if (!p.codes || reinterpret_cast<uintptr_t>(p.codes) % 16) return "wgmma_gemm: null or misaligned codes";
  const int meta = with_config(p.format, 1, 0, [](auto f, auto) { return decltype(f)::META; });
  if (meta && !p.meta) return "wgmma_gemm: this format needs its block scales (meta)";
  return nullptr;
}

int wgmma_blocks_per_sm(int format, int mt) {
  using namespace wgmma;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || !on_sm90(device)) return 0;
  return with_config(format, mt, 0, [](auto f, auto m) { return blocks_per_sm<decltype(f), decltype(m)::value>(); });
}

cudaError_t wgmma_gemm(const MmaPlan& plan, const MmaCall& call, uint8_t* staged, cudaStream_t stream) {
  using namespace wgmma;
  if (wgmma_plan_error(plan) || call.M < 1 || !call.x || !staged) return cudaErrorInvalidValue;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (!on_sm90(device)) return cudaErrorNoKernelImageForDevice;  // sm_90a code runs on 9.0 only
  MmaParams p{};
  static_cast<MmaPlan&>(p) = plan;
  static_cast<MmaCall&>(p) = call;
  p.n16 = (plan.N + 15) / 16;
  p.chunks_per_split = (plan.chunks + plan.splits - 1) / plan.splits;
  if (call.order) {
    p.block_expert = call.table;
    p.block_start = call.table + call.blocks;
    p.block_rows = call.table + 2 * size_t(call.blocks);
  }
  return with_config(plan.format, plan.mt, cudaErrorInvalidValue,
                     [&](auto f, auto m) { return launch<decltype(f), decltype(m)::value>(p, staged, stream); });
}

}  // namespace b12x
