// The offline weight reorder (see weight_layout.hpp): every logical element (n, k) of W goes to the offset
// the kernel's reordered cute layout gives it. int4 nibbles are OR-ed into a zeroed destination word by word,
// so two threads writing the two halves of one byte do not race.
#include <cstdint>

#include "sm90_mixed.h"
#include "weight_layout.hpp"
#include "cutlass/version.h"

namespace sm90mixed {

template <class Quant, class Layout>
__global__ void reorder_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int N, int K, Layout layout) {
  const int64_t total = int64_t(N) * K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int n = int(i / K), k = int(i % K);
    const int64_t off = int64_t(layout(n, k, 0));
    if constexpr (cutlass::sizeof_bits<Quant>::value == 8) {
      dst[off] = src[i];
    } else {
      const uint32_t nib = (src[i >> 1] >> ((i & 1) * 4)) & 0xFu;
      atomicOr(reinterpret_cast<unsigned int*>(dst) + (off >> 3), nib << ((off & 7) * 4));
    }
  }
}

template <class Quant>
static bool reorder_as(const void* src, void* dst, int N, int K, std::string& err) {
  using L = WeightLayout<Quant>;
  const size_t bytes = size_t(N) * size_t(K) * cutlass::sizeof_bits<Quant>::value / 8;
  cudaError_t e = cudaSuccess;
  if constexpr (QuantTraits<Quant>::kShuffle) {
    auto layout = L::reordered(N, K);
    if (int64_t(cute::cosize(layout)) != int64_t(N) * K) {
      err = "reordered layout does not cover N x K exactly";
      return false;
    }
    e = cudaMemset(dst, 0, bytes);
    if (e == cudaSuccess) {
      reorder_kernel<Quant><<<1024, 256>>>(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), N, K, layout);
      e = cudaGetLastError();
    }
  } else {
    e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    err = std::string("reorder: ") + cudaGetErrorString(e);
    return false;
  }
  return true;
}

bool reorder_weight(WeightType t, const void* src, void* dst, int N, int K, std::string& err) {
  if (t == WeightType::FP8) return reorder_as<cutlass::float_e4m3_t>(src, dst, N, K, err);
  return reorder_as<cutlass::int4b_t>(src, dst, N, K, err);
}

bool weight_is_shuffled(WeightType t) {
  return t == WeightType::FP8 ? QuantTraits<cutlass::float_e4m3_t>::kShuffle : QuantTraits<cutlass::int4b_t>::kShuffle;
}

const char* cutlass_version_string() {
  static const std::string v = std::to_string(CUTLASS_MAJOR) + "." + std::to_string(CUTLASS_MINOR) + "." +
                               std::to_string(CUTLASS_PATCH);
  return v.c_str();
}

}  // namespace sm90mixed
