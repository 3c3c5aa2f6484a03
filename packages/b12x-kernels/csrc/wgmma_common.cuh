#pragma once
// What the Hopper (sm_90a) tensor-core GEMM is written in: the PTX (warpgroup MMAs with the A operand in registers,
// mbarriers, bulk copies, L2 policies, shared-memory matrix descriptors) and the kernels that stage x in the B
// operand's shared-memory order. wgmma_gemm.cu (every warp decodes and multiplies) includes it.
#include "mma_gemm.cuh"

// The kernel bodies exist only in the sm_90a pass: wgmma is an sm_90a instruction. Other passes (sm_120a, sm_121a)
// compile empty kernels, and the host entries refuse to launch on anything but a 9.0 device.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define B12X_WGMMA_DEVICE 1
#endif

namespace b12x {
namespace wgmma {
using namespace mma;  // decode functors, MmaParams, tile_rows, WeightStream, store_tile

#ifdef B12X_WGMMA_DEVICE
// ---------------------------------------------------------------------------------------------- wgmma helpers
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ bool elect_one() {  // true in one lane of the converged warp (PTX elect.sync)
  uint32_t p;
  asm volatile("{\n.reg .pred e;\nelect.sync _|e, 0xffffffff;\nselp.u32 %0, 1, 0, e;\n}\n" : "=r"(p));
  return p != 0;
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void bar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// One arrival on the stage's barrier that also raises its expected transaction bytes by `bytes` (0: a plain arrival).
// `bar` as a 32-bit shared-window address, or as a pointer.
__device__ __forceinline__ void bar_arrive_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_arrive_expect(uint64_t* bar, uint32_t bytes) {
  bar_arrive_expect(smem_addr(bar), bytes);
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
// dst and bar as 32-bit shared-window addresses (bulk_copy_to), or as pointers (bulk_copy).
__device__ __forceinline__ void bulk_copy_to(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(pol)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t pol) {
  bulk_copy_to(smem_addr(dst), src, bytes, smem_addr(bar), pol);
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

// d = A (64 × 16 bf16, registers) · B (16 × N bf16, shared memory through desc) + d, or + 0 with scale_d 0 (d's old
// values ignored: a sum's first step needs no zeroed accumulators), N = 8·NT; imm-scale-a = imm-scale-b = 1,
// imm-trans-b = 0 (K-major). Written out per N (the asm needs N/2 operands).
template <int N>
__device__ void mma_async(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc, uint32_t scale_d = 1u);

template <>
__device__ __forceinline__ void mma_async<8>(float (&d)[4], const uint32_t (&a)[4], uint64_t desc,
                                             uint32_t scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3"
      "}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
      : "memory");
}

template <>
__device__ __forceinline__ void mma_async<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t desc,
                                             uint32_t scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
      : "memory");
}

template <>
__device__ __forceinline__ void mma_async<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc,
                                             uint32_t scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
      : "memory");
}

template <>
__device__ __forceinline__ void mma_async<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc,
                                             uint32_t scale_d) {
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
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
      : "memory");
}

template <>
__device__ __forceinline__ void mma_async<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc,
                                             uint32_t scale_d) {
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
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
      : "memory");
}
#endif  // B12X_WGMMA_DEVICE

// ---------------------------------------------------------------------------------------------- stage_x
// x [M, K] (row stride K) -> staged[chunk][sub-chunk][group of 8 tokens][SUB·16 bytes] in the B operand's
// shared-memory order (wgmma_gemm.cu's header): a sub-chunk is SUB of the chunk's KB columns (its k16 steps
// SUB/16·h .. +SUB/16 — four lane elements of every lane per step, so SUB consecutive steps, not consecutive k),
// and within a group block step s' of the sub-chunk sits at s'·256, its K halves 128 bytes apart, token r at 16·r,
// lane slot t at 4·t. SUB = KB (one block per chunk and group) is wgmma_gemm.cu's order.
// One thread per 16-byte piece of x (token m, chunk c, lane slot t, elements 8j..8j+7 of the slot's E):
// a coalesced load, its four 4-byte pairs to steps 2j' and 2j'+1 (j' = j within the slot), K halves 0 and 1.

// The piece (chunk c, staged row `row`, elements e0..e0+7 of the chunk) of value v into its place.
template <class F, int SUB>
__device__ __forceinline__ void store_piece(uint8_t* staged, int groups, int c, int row, int e0, const uint4& v) {
  constexpr int KB = F::KB, E = F::E, SB = SUB / 16;  // k16 steps per sub-chunk (even: s0, s0 + 1 share one)
  static_assert(KB % SUB == 0 && SB % 2 == 0, "whole sub-chunks of an even number of steps");
  const int t = e0 / E, s0 = (e0 % E) / 4, h = s0 / SB, sl = s0 % SB;  // sub-chunk h, its step sl
  uint8_t* block = staged + ((size_t(c) * (KB / SUB) + h) * groups + row / 8) * (SUB * 16) + 16 * (row % 8) + 4 * t;
  *reinterpret_cast<uint32_t*>(block + (2 * sl + 0) * 128) = v.x;
  *reinterpret_cast<uint32_t*>(block + (2 * sl + 1) * 128) = v.y;
  *reinterpret_cast<uint32_t*>(block + (2 * sl + 2) * 128) = v.z;
  *reinterpret_cast<uint32_t*>(block + (2 * sl + 3) * 128) = v.w;
}

template <class F, int SUB = F::KB>
__global__ void stage_x_kernel(const __nv_bfloat16* __restrict__ x, uint8_t* __restrict__ staged, int M, int K,
                               int chunks, int groups) {
#ifdef B12X_WGMMA_DEVICE
  grid_dependents_launch();  // the GEMM after it may start its weight copies (launch.cuh)
  grid_dependency_wait();    // x comes from the kernels before, and the last GEMM may still read `staged`
  constexpr int KB = F::KB, PIECES = KB / 8;  // 16-byte pieces per token and chunk
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= (long long)groups * 8 * chunks * PIECES) return;
  const int pc = int(i % PIECES);
  const long long rest = i / PIECES;
  const int m = int(rest % (groups * 8)), c = int(rest / (groups * 8));
  const int e0 = 8 * pc, k = c * KB + e0;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (m < M && k < K) v = __ldg(reinterpret_cast<const uint4*>(x + size_t(m) * K + k));
  store_piece<F, SUB>(staged, groups, c, m, e0, v);
#endif
}

// The grouped form's staging (a fused MoE's GEMMs): staged row R is row r = R % TOK of table block b = R / TOK, the
// input row of its slot (slot / top_k, or the slot itself), zero past the block's slot count and for idle blocks;
// otherwise as stage_x_kernel.
template <class F, int SUB = F::KB>
__global__ void stage_x_grouped_kernel(const MmaParams p, uint8_t* __restrict__ staged, int groups, int tok) {
#ifdef B12X_WGMMA_DEVICE
  grid_dependents_launch();  // the GEMM after it may start its weight copies (launch.cuh)
  grid_dependency_wait();    // x comes from the kernels before, and the last GEMM may still read `staged`
  constexpr int KB = F::KB, PIECES = KB / 8;
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= (long long)groups * 8 * p.chunks * PIECES) return;
  const int pc = int(i % PIECES);
  const long long rest = i / PIECES;
  const int row = int(rest % (groups * 8)), c = int(rest / (groups * 8));
  const int e0 = 8 * pc, k = c * KB + e0;
  const int b = row / tok, r = row % tok;
  int src = -1;
  if (p.block_expert[b] >= 0 && r < p.block_rows[b]) {
    const int slot = p.order[p.block_start[b] + r];
    src = p.top_k ? slot / p.top_k : slot;
  }
  uint4 v = make_uint4(0, 0, 0, 0);
  if (src >= 0 && k < p.K) v = __ldg(reinterpret_cast<const uint4*>(p.x + size_t(src) * p.K + k));
  store_piece<F, SUB>(staged, groups, c, row, e0, v);
#endif
}

// fn(F{}) for the formats the wgmma kernel decodes without a per-chunk fp32 scale, `fallback` for others;
// wgmma_gemm.cu's with_config adds its token tiles on top.
template <class R, class Fn>
R with_wgmma_format(int format, R fallback, Fn&& fn) {
  switch (format) {
    case FMT_FP8: return fn(FmtFP8{});
    case FMT_MXFP8: return fn(FmtMXFP8{});
    case FMT_NVFP4: return fn(FmtFP4<true>{});
    case FMT_MXFP4: return fn(FmtFP4<false>{});
    case FMT_Q8_0: return fn(FmtQ8_0{});
    default: return fallback;
  }
}

bool on_sm90(int device);  // the device runs sm_90a code (compute capability 9.0 exactly); wgmma_gemm.cu

}  // namespace wgmma

}  // namespace b12x
