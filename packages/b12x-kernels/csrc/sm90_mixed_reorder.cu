// The SM90 mixed-input GEMM's host side (sm90_mixed.h, and its grouped MoE form's: sm90_moe.h): argument rules, the
// dispatch to each weight kind's kernel (sm90_mixed_<kind>.cu, sm90_moe_<kind>.cu) and the prepare-time reorder of the
// codes into the layout those kernels read.
#include <cstdint>

#include "sm90_mixed.h"
#include "sm90_mixed_layout.cuh"
#include "sm90_moe.h"

namespace b12x::sm90 {

#define B12X_SM90_MIXED_DECLARE(NAME)                                                    \
  size_t mixed_workspace_##NAME(const MixedGemmArgs&);                                   \
  cudaError_t mixed_gemm_##NAME(const MixedGemmArgs&, void*, size_t, cudaStream_t);
B12X_SM90_MIXED_DECLARE(e4m3)
B12X_SM90_MIXED_DECLARE(nvfp4)
B12X_SM90_MIXED_DECLARE(mxfp4)
B12X_SM90_MIXED_DECLARE(mxfp8)
B12X_SM90_MIXED_DECLARE(q8_0)
B12X_SM90_MIXED_DECLARE(e4m3_plain)
size_t moe_workspace_nvfp4(const MoeGemmArgs&);
cudaError_t moe_gemm_nvfp4(const MoeGemmArgs&, void*, size_t, cudaStream_t);
size_t moe_workspace_mxfp4(const MoeGemmArgs&);
cudaError_t moe_gemm_mxfp4(const MoeGemmArgs&, void*, size_t, cudaStream_t);

bool mixed_built() { return true; }

const char* mixed_shape_error(const MixedGemmArgs& a) {
  if (a.weight < int(MixedWeight::E4M3) || a.weight > int(MixedWeight::Q8_0)) return "unknown weight kind";
  if (!a.reordered && a.weight != int(MixedWeight::E4M3)) {
    return "FP8 alone has a kernel for the checkpoint's layout; the other kinds read the reordered layout only "
           "(sm90_mixed_reorder's)";
  }
  if (a.m < 1) return "needs m >= 1";
  // The reordered layout tiles whole 64 x 16 fragments; the scale carriers and TMA boxes whole 64-deep k-tiles.
  if (a.n < 64 || a.n % 64) return "needs N a positive multiple of 64";
  if (a.k < kTileK || a.k % kTileK) return "needs K a positive multiple of 64";
  if (a.decomposition < 0 || a.decomposition > 2) return "unknown decomposition";
  if (a.sms < 1) return "needs sms >= 1";
  bool tile = false;
  for (int t : kMixedTokenTiles) tile |= a.tokens == t;
  if (!tile) return "no kernel for that token tile (16, 64, 128 or 256 tokens)";
  return nullptr;
}

const char* mixed_args_error(const MixedGemmArgs& a) {
  if (const char* error = mixed_shape_error(a)) return error;
  if (!a.w || !a.x || !a.y || !a.alpha) return "null weight, x, y or alpha";
  if (a.weight != int(MixedWeight::E4M3) && !a.scales) return "this weight kind needs its block scales";
  // TMA: 16-byte aligned bases
  const auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
  if (misaligned(a.w) || misaligned(a.x) || misaligned(a.y) || misaligned(a.alpha) || misaligned(a.scales) ||
      misaligned(a.bias)) {
    return "weight, scales, x, y, alpha and bias need 16-byte alignment";
  }
  return nullptr;
}

size_t mixed_workspace_bytes(const MixedGemmArgs& a) {
  switch (MixedWeight(a.weight)) {
    case MixedWeight::E4M3: return a.reordered ? mixed_workspace_e4m3(a) : mixed_workspace_e4m3_plain(a);
    case MixedWeight::NVFP4: return a.reordered ? mixed_workspace_nvfp4(a) : 0;
    case MixedWeight::MXFP4: return a.reordered ? mixed_workspace_mxfp4(a) : 0;
    case MixedWeight::MXFP8: return a.reordered ? mixed_workspace_mxfp8(a) : 0;
    case MixedWeight::Q8_0: return a.reordered ? mixed_workspace_q8_0(a) : 0;
  }
  return 0;
}

cudaError_t mixed_gemm(const MixedGemmArgs& a, void* ws, size_t bytes, cudaStream_t s) {
  switch (MixedWeight(a.weight)) {
    case MixedWeight::E4M3: return a.reordered ? mixed_gemm_e4m3(a, ws, bytes, s) : mixed_gemm_e4m3_plain(a, ws, bytes, s);
    case MixedWeight::NVFP4: return a.reordered ? mixed_gemm_nvfp4(a, ws, bytes, s) : cudaErrorInvalidValue;
    case MixedWeight::MXFP4: return a.reordered ? mixed_gemm_mxfp4(a, ws, bytes, s) : cudaErrorInvalidValue;
    case MixedWeight::MXFP8: return a.reordered ? mixed_gemm_mxfp8(a, ws, bytes, s) : cudaErrorInvalidValue;
    case MixedWeight::Q8_0: return a.reordered ? mixed_gemm_q8_0(a, ws, bytes, s) : cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

const char* moe_shape_error(const MoeGemmArgs& a) {
  if (a.weight != int(MixedWeight::NVFP4) && a.weight != int(MixedWeight::MXFP4)) return "converts NVFP4 and MXFP4 only";
  if (a.experts < 1) return "needs experts >= 1";
  // whole k-tiles (the scale carriers, the TMA boxes); 64-row expert blocks keep every expert's bases 16-byte aligned
  if (a.n < 64 || a.n % 64) return "needs N a positive multiple of 64";
  if (a.k < kTileK || a.k % kTileK) return "needs K a positive multiple of 64";
  if (a.sms < 1) return "needs sms >= 1";
  return nullptr;
}

const char* moe_args_error(const MoeGemmArgs& a) {
  if (const char* error = moe_shape_error(a)) return error;
  if (!a.w || !a.scales || !a.x || !a.y || !a.offsets) return "null weight, scales, x, y or offsets";
  const auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
  if (misaligned(a.w) || misaligned(a.scales) || misaligned(a.x) || misaligned(a.y) || misaligned(a.offsets)) {
    return "weight, scales, x, y and offsets need 16-byte alignment";
  }
  return nullptr;
}

size_t moe_workspace_bytes(const MoeGemmArgs& a) {
  return a.weight == int(MixedWeight::NVFP4) ? moe_workspace_nvfp4(a) : moe_workspace_mxfp4(a);
}

cudaError_t moe_gemm(const MoeGemmArgs& a, void* ws, size_t bytes, cudaStream_t s) {
  if (moe_args_error(a)) return cudaErrorInvalidValue;
  return a.weight == int(MixedWeight::NVFP4) ? moe_gemm_nvfp4(a, ws, bytes, s) : moe_gemm_mxfp4(a, ws, bytes, s);
}

// Every logical element (n, k) goes to the offset the kernel's layout gives it. 4-bit codes are OR-ed into a zeroed
// destination a 32-bit word at a time, so two threads writing the two halves of one byte do not race.
template <int kBits, class Layout>
__global__ void reorder_codes(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int n, int k, Layout layout) {
  const int64_t total = int64_t(n) * k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int row = int(i / k), col = int(i % k);
    const int64_t to = int64_t(layout(row, col, 0));
    if constexpr (kBits == 8) {
      dst[to] = src[i];
    } else {
      const uint32_t code = (src[i >> 1] >> ((i & 1) * 4)) & 0xFu;
      atomicOr(reinterpret_cast<unsigned int*>(dst) + (to >> 3), code << ((to & 7) * 4));
    }
  }
}

template <class Codes>
static cudaError_t reorder_as(const void* src, void* dst, int n, int k, cudaStream_t stream) {
  constexpr int bits = cutlass::sizeof_bits<Codes>::value;
  const auto layout = WeightLayout<Codes, true>::of(n, k);
  if (int64_t(cute::cosize(layout)) != int64_t(n) * k) return cudaErrorInvalidValue;
  if (bits == 4) {
    const cudaError_t e = cudaMemsetAsync(dst, 0, size_t(n) * k / 2, stream);
    if (e != cudaSuccess) return e;
  }
  reorder_codes<bits><<<1024, 256, 0, stream>>>(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), n, k,
                                               layout);
  return cudaGetLastError();
}

cudaError_t mixed_reorder(int weight, const void* src, void* dst, int n, int k, cudaStream_t stream) {
  if (n < 64 || n % 64 || k < kTileK || k % kTileK || !src || !dst || src == dst) return cudaErrorInvalidValue;
  // 8-bit codes share one layout (natural order): e4m3 (FP8, MXFP8) and Q8_0's int8 q's
  if (weight == int(MixedWeight::E4M3) || weight == int(MixedWeight::MXFP8)) {
    return reorder_as<cutlass::float_e4m3_t>(src, dst, n, k, stream);
  }
  if (weight == int(MixedWeight::Q8_0)) return reorder_as<int8_t>(src, dst, n, k, stream);
  if (weight == int(MixedWeight::NVFP4) || weight == int(MixedWeight::MXFP4)) {
    return reorder_as<cutlass::float_e2m1_t>(src, dst, n, k, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace b12x::sm90
