// Host entry points of the kernels (plain pointers, sizes, a stream): what module.cpp binds.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace b12x {

enum GgmlFormat : int { kQ8_0 = 0, kIQ2_XXS = 1, kIQ2_XS = 2 };

// y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for m < M <= 16; W: N rows of K/group raw GGML blocks;
// grid: the IQ2 grid as llama.cpp's uint64 entries (unused for Q8_0). Returns the launch error.
cudaError_t gemv_ggml(int format, const uint8_t* w, const uint64_t* grid, const __nv_bfloat16* x,
                      const __nv_bfloat16* bias, __nv_bfloat16* y, int M, int N, int K, cudaStream_t stream);

// out[t, :] = decoded Q8_0 row ids[t] of a [V, H/32, 34] table, bf16.
cudaError_t embedding_q8_0(const uint8_t* table, const void* ids, bool ids_int64, __nv_bfloat16* out, int T,
                           int V, int H, cudaStream_t stream);

}  // namespace b12x
