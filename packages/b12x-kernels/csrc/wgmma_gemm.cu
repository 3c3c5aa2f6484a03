// Hopper (sm_90a) prototype of the tensor-core mixed-input GEMM: warpgroup MMAs (wgmma) over the same weight bytes
// as mma_gemm.cuh (its 1 KB lane-ordered tiles and its decode functors, reused, not copied). No plan picks it yet:
// b12x_core.tensor_core.wgmma launches it directly, for tests and benchmarks/wgmma_linear.py.
//
//   y[m * ldy + n] = bf16(alpha * sum_k x[m, k] * W[n, k] + bias[n])      (bias nullable)
//
// Shape of one CTA: 2 warpgroups = 8 warps = 128 weight rows (warp w decodes row tile 8·blockIdx.y + w exactly as
// the mma.sync kernel does) × 8·NT tokens (blockIdx.x), K whole (no split), one wgmma per k16 step and warpgroup:
//   wgmma.mma_async.sync.aligned.m64n{8·NT}k16.f32.bf16.bf16  d, {a0..a3}, desc_b, 1, 1, 1, 0
// - A = the weights, from registers. PTX ISA 9.7.15.5.1.1.1 (figure "wgmma-64N16-A"): warp w%4 of the warpgroup
//   holds rows 16·(w%4) .. +15 of the 64, and within the warp the four .b32 registers are laid out as mma.sync
//   m16n8k16's A: a0 = (row g, k 2t, 2t+1), a1 = (row g+8, k 2t, 2t+1), a2 = (row g, k 2t+8, 2t+9),
//   a3 = (row g+8, k 2t+8, 2t+9), g = lane/4, t = lane%4. So the mma kernel's fragments feed it unchanged.
// - D = fp32 accumulators, N/2 per thread (figure "wgmma-64N16-D"): d[4j + e] is (row 16·(w%4) + g + 8·(e/2),
//   column 8j + 2t + (e%2)) — per 8 columns j exactly mma.sync's C fragment.
// - B = the activations (N = tokens), from shared memory, K-major (imm-trans-b = 0), no swizzle. The canonical
//   K-major no-swizzle layout (PTX ISA 9.7.15.5.1.2.1.3: ((8,m),(T,2k)):((1T,SBO),(1,LBO)) in 16-byte units) is
//   made of "core matrices" of 8 rows (tokens) × 16 bytes (8 k values), 128 contiguous bytes, row r at 16·r.
//   LBO ("leading dimension byte offset", K-major no swizzle: first to second column of core matrices of the 8x2
//   tile) is the distance between the k 0-7 and k 8-15 core matrices; SBO (stride dimension byte offset: first 8
//   rows to the next 8 rows) the distance between token groups of 8. Here, per k16 step s of a chunk, token group
//   nb, K half h: core matrix at ((s·NT + nb)·2 + h)·128 bytes, so LBO = 128, SBO = 256 and step s starts at
//   s·NT·256. The descriptor (PTX ISA 9.7.15.5.1.2.2): bits 0-13 start address, 16-29 LBO, 32-45 SBO, each
//   (bytes & 0x3FFFF) >> 4; base offset (49-51) 0 and swizzle mode (62-63) 0 = none.
// - The mma kernel's k permutation (mma_gemm.cuh): lane t's k slots hold its own E elements of the chunk; k16 step s
//   takes lane elements 4s..4s+3 of every t: slots 2t, 2t+1 <- 4s, 4s+1 and slots 8+2t, 8+2t+1 <- 4s+2, 4s+3. So B's
//   token row for step s holds, in K half 0, the pairs x[kc + E·t + 4s .. +1] at bytes 4t (t = 0..3), and in K
//   half 1 the pairs x[kc + E·t + 4s + 2 .. +3] at bytes 4t. The staging below moves 4-byte pairs to those places
//   with ordinary loads and stores, then fence.proxy.async.shared::cta (the generic-proxy stores become visible
//   to the async proxy wgmma reads through) and a barrier.
// Pipeline per K chunk c (double-buffered x, weights one chunk ahead in registers): issue the global loads of
// chunk c+1 (x pieces, weight codes, scales); decode chunk c into A fragments; wgmma.fence; E/4 wgmmas (k16 steps)
// reading x buffer c%2; commit; store chunk c+1's x into buffer (c+1)%2 and fence.proxy.async; wgmma.wait_group 0
// (A registers and buffer c%2 free again); __syncthreads.
#include "mma_gemm.cuh"

// The kernel body exists only in the sm_90a pass: wgmma is an sm_90a instruction. Other passes (sm_120a, sm_121a)
// compile an empty kernel, and the host entry refuses to launch on anything but the sm_90a binary.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define B12X_WGMMA_DEVICE 1
#endif

namespace b12x {
namespace wgmma {
using namespace mma;  // decode functors (FmtFP8, FmtMXFP8, FmtFP4<NV>, FmtQ8_0) and their helpers

constexpr int kWarps = MMA_TILES_PER_CTA;  // row tiles (of 16) per CTA, one per warp
constexpr int kThreads = 32 * kWarps;
static_assert(kWarps == 8, "two warpgroups of four warps");

struct Params : WgmmaPlan {
  const __nv_bfloat16* x;  // [M, K], 16-byte aligned
  const __nv_bfloat16* bias;
  __nv_bfloat16* y;
  int M;
  int n16;
};

template <class F, int NT>
constexpr int smem_bytes() {  // two x buffers of 8·NT tokens × one chunk
  return 2 * 8 * NT * F::KB * 2;
}

#ifdef B12X_WGMMA_DEVICE
// ---------------------------------------------------------------------------------------------- wgmma helpers
// The layout puts the k 0-7 and k 8-15 core matrices of a token group 128 bytes apart and token groups 256 bytes
// apart. LBO is the K-direction distance and SBO the token-direction one (PTX ISA, K-major, no swizzle); building
// with -DB12X_WGMMA_SWAP_LBO_SBO swaps the two fields (a diagnosis aid should the hardware read them the other way:
// nt = 1 never uses SBO, so nt = 1 right and nt >= 2 wrong points at SBO).
#ifndef B12X_WGMMA_SWAP_LBO_SBO
constexpr uint32_t kLBO = 128, kSBO = 256;
#else
constexpr uint32_t kLBO = 256, kSBO = 128;
#endif
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Keeps the compiler from moving accumulator reads or writes across the wgmma fences (CUTLASS's
// warpgroup_fence_operand).
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ uint64_t desc_field(uint32_t bytes) { return (bytes & 0x3FFFFu) >> 4; }
// K-major, no swizzle, base offset 0: start address | LBO << 16 | SBO << 32 (see the header).
__device__ __forceinline__ uint64_t smem_desc(uint32_t smem_addr) {
  return desc_field(smem_addr) | (desc_field(kLBO) << 16) | (desc_field(kSBO) << 32);
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

// ---------------------------------------------------------------------------------------------- kernel
template <class F, int NT>
__global__ void __launch_bounds__(kThreads, 1) wgmma_gemm_kernel(const Params p) {
#ifdef B12X_WGMMA_DEVICE
  static_assert(!F::ACC, "a per-chunk fp32 scale needs partial accumulators, which this prototype does not keep");
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int TOK = 8 * NT, KB = F::KB, E = F::E;
  constexpr int STEPS = KB / 16;  // k16 steps per chunk (E/4: each takes 4 elements of every lane)
  constexpr int GROUPS = E / 8;   // decode8 groups per chunk: two steps each
  constexpr int BUF = TOK * KB * 2;
  constexpr int ROW_PIECES = KB / 8;  // 16-byte pieces of x per token and chunk
  constexpr int PIECES = TOK * ROW_PIECES, PER_THREAD = (PIECES + kThreads - 1) / kThreads;
  static_assert(STEPS == 2 * GROUPS, "two k16 steps per decode group");
  static_assert(E % 8 == 0, "a 16-byte x piece stays inside one lane's E elements");

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane >> 2, t = lane & 3;
  const int tok0 = blockIdx.x * TOK;
  const int tile = blockIdx.y * kWarps + warp;  // this warp's row tile (wgmma rows 16·(warp%4) of its warpgroup)
  const bool live = tile < p.n16;               // uniform per warp; dead warps feed zeros (wgmma is collective)
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  // x: piece i of a chunk is token i / ROW_PIECES, elements 8·(i % ROW_PIECES) .. +7 of the chunk; zero past M, K.
  uint4 xr[PER_THREAD];
  auto load_x = [&](int c) {
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      xr[i] = make_uint4(0, 0, 0, 0);
      if (idx < PIECES) {
        const int m = tok0 + idx / ROW_PIECES, k = c * KB + 8 * (idx % ROW_PIECES);
        if (m < p.M && k < p.K) xr[i] = __ldg(reinterpret_cast<const uint4*>(p.x + size_t(m) * p.K + k));
      }
    }
  };
  // The piece's elements e0 .. e0+7 (e0 = 8·pc) belong to lane slot tt = e0 / E, lane elements w0 .. w0+7
  // (w0 = e0 % E, a multiple of 8): steps s0 = w0/4 and s0+1, pairs (4s, 4s+1) to K half 0, (4s+2, 4s+3) to half 1.
  auto store_x = [&](int buf) {
    uint8_t* b = smem + buf * BUF;
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      if (idx < PIECES) {
        const int n = idx / ROW_PIECES, e0 = 8 * (idx % ROW_PIECES);
        const int tt = e0 / E, s0 = (e0 % E) / 4, nb = n >> 3, r = n & 7;
        auto at = [&](int s, int h) {
          return reinterpret_cast<uint32_t*>(b + ((s * NT + nb) * 2 + h) * 128 + r * 16 + 4 * tt);
        };
        *at(s0, 0) = xr[i].x;
        *at(s0, 1) = xr[i].y;
        *at(s0 + 1, 0) = xr[i].z;
        *at(s0 + 1, 1) = xr[i].w;
      }
    }
  };
  // Weights of chunk c: the lane's two 16-byte code pieces (rows q and q+8) and their scale state, straight from
  // global memory (the tile layout's lane order makes both code loads coalesced).
  using S = typename F::S;
  auto load_w = [&](int c, uint4 (&w)[2], S (&sc)[2]) {
    if (!live) {
      w[0] = w[1] = make_uint4(0, 0, 0, 0);
      sc[0] = sc[1] = S{};
      return;
    }
    const size_t tc = size_t(tile) * p.chunks + c;
    const uint4* codes = reinterpret_cast<const uint4*>(p.codes) + tc * 64 + lane;
    w[0] = __ldg(codes);
    w[1] = __ldg(codes + 32);
    const uint8_t* m = p.meta + tc * 16 * F::META;
    sc[0] = F::scale(m + q * F::META, nullptr, t, w[0], p.scale_mul);
    sc[1] = F::scale(m + (8 + q) * F::META, nullptr, t, w[1], p.scale_mul);
  };

  float acc[TOK / 2];
#pragma unroll
  for (int i = 0; i < TOK / 2; ++i) acc[i] = 0.f;

  uint4 w[2];
  S sc[2];
  load_x(0);
  load_w(0, w, sc);
  store_x(0);
  fence_proxy_async();
  __syncthreads();
  for (int c = 0; c < p.chunks; ++c) {
    const int buf = c & 1;
    const bool more = c + 1 < p.chunks;  // uniform over the CTA
    uint4 wn[2];
    S sn[2];
    if (more) {
      load_x(c + 1);
      load_w(c + 1, wn, sn);
    }
    uint32_t a[STEPS][4];  // step 2g: lane elements 8g..8g+3, step 2g+1: 8g+4..8g+7 (as mma16816's two calls)
    static_for<GROUPS>([&](auto G) {
      constexpr int g = decltype(G)::value;
      uint32_t lo[4], hi[4];  // rows q and q+8
      F::template decode8<g>(w[0], sc[0], nullptr, lane, lo);
      F::template decode8<g>(w[1], sc[1], nullptr, lane, hi);
      a[2 * g][0] = lo[0];
      a[2 * g][1] = hi[0];
      a[2 * g][2] = lo[1];
      a[2 * g][3] = hi[1];
      a[2 * g + 1][0] = lo[2];
      a[2 * g + 1][1] = hi[2];
      a[2 * g + 1][2] = lo[3];
      a[2 * g + 1][3] = hi[3];
    });
    fence_operands(acc);
    wg_fence();  // orders the A registers just written (and the accumulators) before the wgmmas read them
    static_for<STEPS>([&](auto St) {
      constexpr int s = decltype(St)::value;
      mma_async<TOK>(acc, a[s], smem_desc(smem_addr + buf * BUF + s * NT * 256));
    });
    wg_commit();
    if (more) {
      store_x(buf ^ 1);  // the other buffer: its last reader (chunk c-1's wgmmas) completed before the barrier
      fence_proxy_async();
    }
    wg_wait_all();  // this chunk's wgmmas are done: A registers and buffer `buf` may change
    fence_operands(acc);
    __syncthreads();  // buffer buf^1 written by every thread (and fenced); buffer buf read by both warpgroups
    if (more) {
      w[0] = wn[0];
      w[1] = wn[1];
      sc[0] = sn[0];
      sc[1] = sn[1];
    }
  }

  // Epilogue: d[4j + e] is weight row 16·tile + q + 8·(e/2), token tok0 + 8j + 2t + (e%2).
  if (!live) return;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = tile * 16 + q + 8 * (e >> 1), tok = tok0 + 8 * j + 2 * t + (e & 1);
      if (row >= p.N || tok >= p.M) continue;
      float v = acc[4 * j + e] * p.alpha;
      if (p.bias) v += __bfloat162float(p.bias[row]);
      p.y[size_t(tok) * p.ldy + row] = __float2bfloat16_rn(v);
    }
#endif  // B12X_WGMMA_DEVICE
}

template <class F, int NT>
cudaError_t launch(const Params& p, cudaStream_t stream) {
  constexpr int bytes = smem_bytes<F, NT>();
  static_assert(bytes <= 227 * 1024, "shared memory of one CTA");
  auto kernel = wgmma_gemm_kernel<F, NT>;
  // On a 9.0 device (wgmma_gemm checked) the only image this object holds that can load is sm_90a: a build
  // without it fails here with cudaErrorNoKernelImageForDevice (no PTX is embedded to fall back on).
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.M + 8 * NT - 1) / (8 * NT), (p.n16 + kWarps - 1) / kWarps);
  kernel<<<grid, kThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

template <class F>
cudaError_t launch_nt(const Params& p, cudaStream_t stream) {
  switch (p.nt) {
    case 1: return launch<F, 1>(p, stream);
    case 2: return launch<F, 2>(p, stream);
    case 4: return launch<F, 4>(p, stream);
    case 8: return launch<F, 8>(p, stream);
    case 16: return launch<F, 16>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

// fn(F{}) for the formats this prototype runs, `fallback` for the others.
template <class R, class Fn>
R with_format(int format, R fallback, Fn&& fn) {
  switch (format) {
    case FMT_FP8: return fn(FmtFP8{});
    case FMT_MXFP8: return fn(FmtMXFP8{});
    case FMT_NVFP4: return fn(FmtFP4<true>{});
    case FMT_MXFP4: return fn(FmtFP4<false>{});
    case FMT_Q8_0: return fn(FmtQ8_0{});
    default: return fallback;
  }
}

}  // namespace wgmma

const char* wgmma_plan_error(const WgmmaPlan& p) {
  using namespace wgmma;
  const int ck = with_format(p.format, 0, [](auto f) { return decltype(f)::KB; });
  if (!ck) return "wgmma_gemm: format must be FP8, MXFP8, NVFP4, MXFP4 or Q8_0 (no per-chunk fp32 scale)";
  if (p.N < 1 || p.K < 8 || p.K % 8) return "wgmma_gemm: need N >= 1 and K % 8 == 0";
  if (p.chunks < 1 || p.chunks * ck < p.K) return "wgmma_gemm: the repacked weight covers fewer than K columns";
  if (p.nt != 1 && p.nt != 2 && p.nt != 4 && p.nt != 8 && p.nt != 16) return "wgmma_gemm: nt must be 1, 2, 4, 8 or 16";
  if (p.ldy < p.N) return "wgmma_gemm: need ldy >= N";
  if (!p.codes || reinterpret_cast<uintptr_t>(p.codes) % 16) return "wgmma_gemm: null or misaligned codes";
  const int meta = with_format(p.format, 0, [](auto f) { return decltype(f)::META; });
  if (meta && !p.meta) return "wgmma_gemm: this format needs its block scales (meta)";
  return nullptr;
}

cudaError_t wgmma_gemm(const WgmmaPlan& plan, const __nv_bfloat16* x, const __nv_bfloat16* bias, __nv_bfloat16* y,
                       int M, cudaStream_t stream) {
  using namespace wgmma;
  if (wgmma_plan_error(plan) || M < 1 || !x || !y) return cudaErrorInvalidValue;
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  if (major != 9 || minor != 0) return cudaErrorNoKernelImageForDevice;  // sm_90a code runs on 9.0 only
  Params p{};
  static_cast<WgmmaPlan&>(p) = plan;
  p.x = x;
  p.bias = bias;
  p.y = y;
  p.M = M;
  p.n16 = (plan.N + 15) / 16;
  return with_format(plan.format, cudaErrorInvalidValue, [&](auto f) { return launch_nt<decltype(f)>(p, stream); });
}

}  // namespace b12x
