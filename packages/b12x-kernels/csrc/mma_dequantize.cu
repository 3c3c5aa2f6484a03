// The tensor-core layout's weight decoded to bf16 [N, K] (decode + cuBLAS's decode pass): the same decodes as the
// GEMM (mma_gemm.cuh's formats), one thread per lane of a half tile, so a warp reads 512 contiguous bytes and each
// thread stores 8·E/8 contiguous bf16 values with 16-byte stores.
//
// Why in CUDA: the Triton pass (b12x_kernels.mma_decode) spends about 22 instructions a weight on NVFP4 (its E2M1
// field gathers, and a move of the decoded tile through shared memory before the stores), so on the H200 it runs at
// 60% of the copy bandwidth, instruction-bound; here a lane's 32 E2M1 codes take the GEMM's few shifts and masks a
// pair and one bf16x2 multiply.
//
// Values: out[n·ldy + k] = bf16(W[n, k] · row_scale[n]) (row_scale null: 1), W the weight the GEMM multiplies with
// alpha's power of two (2^bias / scale_mul) taken back: bit for bit the Triton pass (b12x_kernels.mma_decode) and the
// checkpoint-layout decode. The decodes give W·2^-e exactly (a bf16 bit pattern times scale·scale_mul, exact by the
// host's choice of scale_mul), and (W·2^-e)·(row_scale·2^e) is the same real product as W·row_scale, so it rounds
// to the same float. FP8_BLOCK's fp32 block scale multiplies first, as in the Triton pass (W·bs, then ·row_scale).
// IQ2 (its grid and sign tables live in shared memory in the GEMM) is not decoded here.
#include <cstring>

#include "mma_gemm.cuh"

namespace b12x {
namespace {
using namespace mma;

// The power of two the format's bit-pattern decode leaves the value under (mma_gemm.cuh: E4M3 pairs are worth
// value·2^-120, E2M1 pairs value·2^-126; Q8_0 decodes the value itself).
__host__ __device__ constexpr int decode_bias(int format) {
  return format == FMT_Q8_0 ? 0 : format == FMT_NVFP4 || format == FMT_MXFP4 ? 126 : 120;
}
// The biased exponent field of 2^bias / scale_mul for a power of two scale_mul (its field subtracted, no division).
__host__ __device__ constexpr int unscale_field(int format, uint32_t scale_mul_bits) {
  return 254 + decode_bias(format) - int((scale_mul_bits >> 23) & 255u);
}

constexpr int kWarps = 8;  // a block: 4 row tiles (8 half tiles, a warp each) × one chunk

template <class F>
__global__ void __launch_bounds__(32 * kWarps) mma_dequantize_kernel(const MmaPlan p, __nv_bfloat16* __restrict__ out) {
  const int lane = threadIdx.x & 31, q = lane >> 2, t = lane & 3;  // row q of the half, quarter t of its chunk
  const int warp = threadIdx.x >> 5, c = blockIdx.y;
  const int tile = blockIdx.x * (kWarps / 2) + (warp >> 1), h = warp & 1;  // row tile, and its half (rows 8h..)
  const int n = tile * 16 + h * 8 + q;
  if (n >= p.N) return;
  const long long tile_chunk = static_cast<long long>(tile) * p.chunks + c;
  const uint4 codes = *reinterpret_cast<const uint4*>(p.codes + (tile_chunk * 2 + h) * 512 + 16 * lane);
  const long long row_chunk = tile_chunk * 16 + h * 8 + q;  // the row's scale bytes of this chunk
  const uint8_t* meta = F::META ? p.meta + row_chunk * F::META : nullptr;  // FP8 / FP8_BLOCK have none
  const typename F::S s = F::scale(meta, nullptr, t, codes, p.scale_mul);
  // row_scale · 2^bias / scale_mul: exact (powers of two), the value's own power of two taken back below
  const float unscale = __int_as_float(unscale_field(p.format, __float_as_uint(p.scale_mul)) << 23);
  const float factor = (p.row_scale ? p.row_scale[n] : 1.f) * unscale;
  const int k0 = c * F::KB + t * F::E;  // the lane's first column
  float block = 1.f;  // FP8_BLOCK: the fp32 scale of the 128×128 block (a lane's E columns lie in one)
  if constexpr (std::is_same_v<F, FmtFP8Block>) {
    const int kblocks = (p.K + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE;
    block = p.block_scale[(n / FP8_BLOCK_SIZE) * kblocks + k0 / FP8_BLOCK_SIZE];
  }
  __nv_bfloat16* row = out + static_cast<long long>(n) * p.ldy;
  static_for<F::E / 8>([&](auto G) {
    constexpr int g = decltype(G)::value;
    const int k = k0 + 8 * g;
    if (k >= p.K) return;  // K % 8 == 0: a group of 8 is whole or past K (the chunk's padding)
    uint32_t a[4];
    F::template decode8<g>(codes, s, nullptr, lane, a);
    uint4 v;
    uint32_t* packed = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 w = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a[i]));
      if constexpr (std::is_same_v<F, FmtFP8Block>) w = make_float2(__fmul_rn(w.x, block), __fmul_rn(w.y, block));
      packed[i] = pack_bf16(__fmul_rn(w.x, factor), __fmul_rn(w.y, factor));
    }
    *reinterpret_cast<uint4*>(row + k) = v;
  });
}

template <class F>
cudaError_t launch(const MmaPlan& p, __nv_bfloat16* out, cudaStream_t stream) {
  const dim3 grid((p.N + 16 * (kWarps / 2) - 1) / (16 * (kWarps / 2)), p.chunks);
  mma_dequantize_kernel<F><<<grid, 32 * kWarps, 0, stream>>>(p, out);
  return cudaGetLastError();
}
}  // namespace

const char* mma_dequantize_error(const MmaPlan& p) {
  if (p.format == FMT_IQ2_XXS || p.format == FMT_IQ2_XS)
    return "mma_dequantize: IQ2 decodes through shared-memory tables: the Triton pass (b12x_kernels.mma_decode) "
           "runs it";
  const int kb = p.format == FMT_NVFP4 || p.format == FMT_MXFP4 ? FmtFP4<true>::KB
                 : p.format == FMT_Q8_0                         ? FmtQ8_0::KB
                 : p.format == FMT_FP8 || p.format == FMT_FP8_BLOCK || p.format == FMT_MXFP8 ? FmtFP8::KB
                                                                                              : 0;
  if (!kb) return "mma_dequantize: unknown format";
  if (p.N < 1 || p.K < 8 || p.K % 8) return "mma_dequantize: need N >= 1 and K % 8 == 0";
  if (p.chunks * kb < p.K) return "mma_dequantize: the repacked weight covers fewer than K columns";
  if (p.ldy < p.K || p.ldy % 8) return "mma_dequantize: the output's row stride (ldy) must be >= K and a multiple of 8";
  if (!p.codes || (p.format != FMT_FP8 && p.format != FMT_FP8_BLOCK && !p.meta))
    return "mma_dequantize: null codes, or null scale bytes (meta) for a block-scaled format";
  if (p.format == FMT_FP8_BLOCK && !p.block_scale) return "mma_dequantize: FP8_BLOCK needs its block scales";
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &p.scale_mul, sizeof scale_bits);
  const int field = unscale_field(p.format, scale_bits);
  if ((scale_bits & 0x807FFFFFu) || field < 1 || field > 254)
    return "mma_dequantize: scale_mul must be a normal power of two whose 2^bias / scale_mul is a normal float";
  if (p.chunks > 65535) return "mma_dequantize: at most 65535 chunks (a grid dimension)";
  return nullptr;
}

cudaError_t mma_dequantize(const MmaPlan& p, __nv_bfloat16* out, cudaStream_t stream) {
  if (mma_dequantize_error(p) || !out) return cudaErrorInvalidValue;
  switch (p.format) {
    case FMT_FP8: return launch<FmtFP8>(p, out, stream);
    case FMT_FP8_BLOCK: return launch<FmtFP8Block>(p, out, stream);
    case FMT_MXFP8: return launch<FmtMXFP8>(p, out, stream);
    case FMT_NVFP4: return launch<FmtFP4<true>>(p, out, stream);
    case FMT_MXFP4: return launch<FmtFP4<false>>(p, out, stream);
    case FMT_Q8_0: return launch<FmtQ8_0>(p, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace b12x
