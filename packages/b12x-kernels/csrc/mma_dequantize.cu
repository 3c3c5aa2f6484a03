// The tensor-core layout's weight dequantized to bf16 [N, K] (dequantize + cuBLAS's dequantize pass): the same decodes
// as the GEMM (mma_gemm.cuh's formats), one thread per lane of a half tile, so a warp reads 512 contiguous bytes, and
// stores whole rows of the chunk (through shared memory) with 16-byte stores.
//
// Why in CUDA: the Triton pass (b12x_kernels.mma_dequant) spends about 22 instructions a weight on NVFP4 (its E2M1
// field gathers, and a move of the decoded tile through shared memory before the stores), so on the H200 it runs at
// 60% of the copy bandwidth, instruction-bound; here a lane's 32 E2M1 codes take the GEMM's few shifts and masks a
// pair and one bf16x2 multiply.
//
// Values: out[n·ldy + k] = bf16(W[n, k] · row_scale[n]) (row_scale null: 1), W the weight the GEMM multiplies with
// alpha's power of two (2^bias / scale_mul) taken back: bit for bit the Triton pass (b12x_kernels.mma_dequant) and the
// checkpoint-layout dequantization. The decodes give W·2^-e exactly (a bf16 bit pattern times scale·scale_mul, exact by
// the host's choice of scale_mul), and (W·2^-e)·(row_scale·2^e) is the same real product as W·row_scale, so it rounds
// to the same float. FP8_BLOCK's fp32 block scale multiplies first, as in the Triton pass (W·bs, then ·row_scale).
// IQ2 is not the GEMM's decode (which leaves the block's d to the partial sums): iq2_group below.
#include <cstring>

#include "mma_gemm.cuh"

namespace b12x {
namespace {
using namespace mma;

// The biased exponent field of 2^F::BIAS / scale_mul for a power of two scale_mul (its field subtracted, no
// division): F's decodes give value·2^-BIAS·scale_mul.
template <class F>
__host__ __device__ constexpr int unscale_field(uint32_t scale_mul_bits) {
  return 254 + F::BIAS - int((scale_mul_bits >> 23) & 255u);
}

constexpr int kWarps = 8;  // a block: 4 row tiles (8 half tiles, a warp each) × one chunk

// A warp's decoded half tile (8 rows × one chunk, KB bf16 each) passes through shared memory so that the global
// stores cover whole rows: a lane decodes E columns of one row (quarter t of the chunk), which stored directly would
// leave every 32-byte sector half written per instruction (measured: 30% of copy for NVFP4, L2-bound). In 16-byte
// units, unit u = t·G + g of row q (G = E/8 groups a lane) is stored at unit t·G + (g ^ swz(q, t)), so the 8 lanes of
// each shared-memory phase hit 8 different bank groups on the way in and on the way out (checked for both G).
template <class F>
__device__ __forceinline__ int swizzled_unit(int q, int t, int g) {
  // G: 8 (IQ2: 32 units a row), 4 (FP4: 16) or 2 (8-bit: 8); the XOR stays inside a lane's G units
  constexpr int G = F::E / 8;
  if constexpr (G == 8) return t * G + (g ^ (t | ((q & 1) << 2)));
  else if constexpr (G == 4) return t * G + (g ^ ((t >> 1) | ((q & 1) << 1)));
  else return t * G + (g ^ (q & 1));
}

// Group g (8 weights) of an IQ2 lane (64 weights: the GEMM's lane layout, FmtIQ2::decode8's fields) as the
// checkpoint dequantization gives it (b12x_kernels.tiles / mma_dequant, llama.cpp's order): db = d·(0.5 + s)·0.25 in
// fp32, each weight bf16(±grid·db), then bf16(that · factor). A group has three magnitudes, so the three results are
// computed once and the 8 weights picked with the GEMM's selector tables (layout.iq2_tables: a grid word's nibble e is
// the code 0..2 of 8 / 25 / 43, the sign word adds 4 where negative; round-to-nearest is symmetric, so a negative
// weight is the positive one with its sign bit set), read through L1.
template <class F, int G>
__device__ __forceinline__ void iq2_group(const uint4& q, const uint8_t* meta2, int t, const uint32_t* tables, float d,
                                          float factor, uint32_t (&a)[4]) {
  uint32_t grid_idx, sign_idx;
  F::template group_indices<G>(q, grid_idx, sign_idx);
  // the 4-bit sub-block scale: IQ2_XS one per 16 weights in meta2, IQ2_XXS one per 32 atop its sign word
  const uint32_t sub = F::META2 ? (*reinterpret_cast<const uint16_t*>(meta2 + 2 * t) >> (4 * (G >> 1))) & 15u
                                : word(q, 2 * (G >> 2) + 1) >> 28;
  const float db = __fmul_rn(__fmul_rn(d, 0.5f + float(sub)), 0.25f);
  auto value = [&](float grid) {  // bf16(bf16(grid · db) · factor), as bf16 bits
    const float w = __bfloat162float(__float2bfloat16_rn(__fmul_rn(grid, db)));
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(w, factor))));
  };
  const Iq2Scaled table = iq2_table(value(8.f) | (value(25.f) << 16), value(43.f));
  iq2_values(__ldg(tables + grid_idx) | __ldg(tables + F::GRID + sign_idx), table, a);
}

template <class F>
__global__ void __launch_bounds__(32 * kWarps) mma_dequantize_kernel(const MmaArgs p, __nv_bfloat16* __restrict__ out) {
  constexpr int G = F::E / 8, UNITS = F::KB / 8;  // 16-byte units: a lane's, a row's
  __shared__ uint4 staged[kWarps][8 * UNITS];
  const int lane = threadIdx.x & 31, q = lane >> 2, t = lane & 3;  // row q of the half, quarter t of its chunk
  const int warp = threadIdx.x >> 5, c = blockIdx.y;
  const int tile = blockIdx.x * (kWarps / 2) + (warp >> 1), h = warp & 1;  // row tile, and its half (rows 8h..)
  const int n0 = tile * 16 + h * 8, n = n0 + q;
  if (n0 >= p.N) return;  // the whole half tile is past N (warp-uniform); rows past N inside it are not stored
  const long long tile_chunk = static_cast<long long>(tile) * p.chunks + c;
  const uint4 codes = *reinterpret_cast<const uint4*>(p.codes + (tile_chunk * 2 + h) * 512 + 16 * lane);
  const long long row_chunk = tile_chunk * 16 + h * 8 + q;  // the row's scale bytes of this chunk
  const uint8_t* meta = F::META ? p.meta + row_chunk * F::META : nullptr;  // FP8 / FP8_BLOCK have none
  const uint8_t* meta2 = F::META2 ? p.meta2 + row_chunk * F::META2 : nullptr;  // IQ2_XS's sub-block scales
  // row_scale · 2^bias / scale_mul: exact (powers of two), the value's own power of two taken back below
  const float unscale = __int_as_float(unscale_field<F>(__float_as_uint(p.scale_mul)) << 23);
  const float factor = (p.row_scale && n < p.N ? p.row_scale[n] : 1.f) * unscale;
  float block = 1.f;  // FP8_BLOCK: the fp32 scale of the 128×128 block (a lane's E columns lie in one)
  if constexpr (std::is_same_v<F, FmtFP8Block>) {
    const int kblocks = (p.K + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE;
    block = p.block_scale[(min(n, p.N - 1) / FP8_BLOCK_SIZE) * kblocks + (c * F::KB + t * F::E) / FP8_BLOCK_SIZE];
  }
  uint4* mine = staged[warp];
  if constexpr (is_iq2<F>) {
    const float d = __half2float(*reinterpret_cast<const __half*>(meta));  // the row's 256-weight block
    static_for<G>([&](auto I) {
      constexpr int g = decltype(I)::value;
      uint4 v;
      iq2_group<F, g>(codes, meta2, t, p.tables, d, factor, *reinterpret_cast<uint32_t(*)[4]>(&v));
      mine[q * UNITS + swizzled_unit<F>(q, t, g)] = v;  // the chunk's padding past K decodes too, never stored
    });
  } else {
    const typename F::S s = F::scale(meta, meta2, t, codes, p.scale_mul);
    static_for<G>([&](auto I) {
      constexpr int g = decltype(I)::value;
      uint32_t a[4];
      F::template decode8<g>(codes, s, nullptr, lane, a);  // the chunk's padding past K decodes too, never stored
      uint4 v;
      uint32_t* packed = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float2 w = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a[i]));
        if constexpr (std::is_same_v<F, FmtFP8Block>) w = make_float2(__fmul_rn(w.x, block), __fmul_rn(w.y, block));
        packed[i] = pack_bf16(__fmul_rn(w.x, factor), __fmul_rn(w.y, factor));
      }
      mine[q * UNITS + swizzled_unit<F>(q, t, g)] = v;
    });
  }
  __syncwarp();
  // a store instruction: 32 / UNITS whole rows, UNITS lanes a row, 16 contiguous bytes a lane
  constexpr int ROWS = 32 / UNITS;
#pragma unroll
  for (int i = 0; i < 8 / ROWS; ++i) {
    const int r = i * ROWS + lane / UNITS, u = lane % UNITS;
    const int k = c * F::KB + 8 * u;
    if (n0 + r < p.N && k < p.K)  // K % 8 == 0: a unit of 8 columns is whole or past K (the chunk's padding)
      *reinterpret_cast<uint4*>(out + static_cast<long long>(n0 + r) * p.ldy + k) =
          mine[r * UNITS + swizzled_unit<F>(r, u / G, u % G)];
  }
}

template <class F>
cudaError_t launch(const MmaArgs& p, __nv_bfloat16* out, cudaStream_t stream) {
  const dim3 grid((p.N + 16 * (kWarps / 2) - 1) / (16 * (kWarps / 2)), p.chunks);
  return launch_kernel(false, mma_dequantize_kernel<F>, grid, dim3(32 * kWarps), 0, stream, p, out);  // its own status
}
}  // namespace

const char* mma_dequantize_error(const MmaArgs& p) {
  return with_format(p.format, "mma_dequantize: unknown format", [&](auto f) -> const char* {
    using F = decltype(f);
    if (p.N < 1 || p.K < 8 || p.K % 8) return "mma_dequantize: need N >= 1 and K % 8 == 0";
    if (p.chunks * F::KB < p.K) return "mma_dequantize: the repacked weight covers fewer than K columns";
    if (p.ldy < p.K || p.ldy % 8)
      return "mma_dequantize: the output's row stride (ldy) must be >= K and a multiple of 8";
    if (!p.codes || reinterpret_cast<uintptr_t>(p.codes) % 16)
      return "mma_dequantize: null or misaligned codes (16-byte loads)";
    if (F::META && !p.meta) return "mma_dequantize: null scale bytes (meta) for a block-scaled format";
    if (F::META2 && !p.meta2) return "mma_dequantize: IQ2_XS needs its sub-block scales (meta2)";
    if (is_iq2<F> && !p.tables) return "mma_dequantize: IQ2 needs its grid and sign tables (layout.iq2_tables)";
    if (std::is_same_v<F, FmtFP8Block> && !p.block_scale) return "mma_dequantize: FP8_BLOCK needs its block scales";
    uint32_t scale_bits;
    std::memcpy(&scale_bits, &p.scale_mul, sizeof scale_bits);
    const int field = unscale_field<F>(scale_bits);
    if ((scale_bits & 0x807FFFFFu) || field < 1 || field > 254)
      return "mma_dequantize: scale_mul must be a normal power of two whose 2^bias / scale_mul is a normal float";
    if (p.chunks > 65535) return "mma_dequantize: at most 65535 chunks (a grid dimension)";
    return nullptr;
  });
}

cudaError_t mma_dequantize(const MmaArgs& p, __nv_bfloat16* out, cudaStream_t stream) {
  if (mma_dequantize_error(p) || !out) return cudaErrorInvalidValue;
  return with_format(p.format, cudaErrorInvalidValue, [&](auto f) { return launch<decltype(f)>(p, out, stream); });
}

}  // namespace b12x
