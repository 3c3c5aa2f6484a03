// Q8_0 embedding gather: one thread block per id, each thread decodes pairs of weights of the row.
#include "common.cuh"
#include "kernels.h"
#include "launch.cuh"

namespace b12x {
namespace {

template <class Id>
__global__ void embedding_kernel(const uint8_t* __restrict__ table, const Id* __restrict__ ids,
                                 __nv_bfloat16* __restrict__ out, int V, int H) {
  const int t = blockIdx.x;
  const long long id = static_cast<long long>(ids[t]);
  __nv_bfloat16* dst = out + size_t(t) * H;
  if (id < 0 || id >= V) {  // the host checks ids on CPU tensors; on the GPU an invalid id yields NaN
    for (int k = threadIdx.x; k < H; k += blockDim.x) dst[k] = __float2bfloat16(__int_as_float(0x7fc00000));
    return;
  }
  const uint8_t* row = table + size_t(id) * (H / Q8_0_GROUP) * Q8_0_BYTES;
  for (int k2 = threadIdx.x; k2 < H / 2; k2 += blockDim.x) {
    const int k = 2 * k2, blk = k / Q8_0_GROUP, j = k % Q8_0_GROUP;
    const uint8_t* b = row + blk * Q8_0_BYTES;
    const float d = load_half_a2(b);
    const uint16_t pair = *reinterpret_cast<const uint16_t*>(b + Q8_0_QS_OFFSET + j);
    __nv_bfloat162 v;
    v.x = __float2bfloat16(d * float(int8_t(pair & 0xff)));
    v.y = __float2bfloat16(d * float(int8_t(pair >> 8)));
    *reinterpret_cast<__nv_bfloat162*>(dst + k) = v;
  }
}

}  // namespace

cudaError_t embedding_q8_0(const uint8_t* table, const void* ids, bool ids_int64, __nv_bfloat16* out, int T,
                           int V, int H, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  const int threads = H / 2 < 256 ? ((H / 2 + 31) / 32) * 32 : 256;
  // launch_kernel returns this launch's own status: a `return cudaGetLastError()` would also report an error some
  // earlier runtime call left behind (a plan's occupancy question on SM12x, say) as this launch's
  if (ids_int64)
    return launch_kernel(false, embedding_kernel<long long>, dim3(T), dim3(threads), 0, stream, table,
                         static_cast<const long long*>(ids), out, V, H);
  return launch_kernel(false, embedding_kernel<int>, dim3(T), dim3(threads), 0, stream, table,
                       static_cast<const int*>(ids), out, V, H);
}

}  // namespace b12x
