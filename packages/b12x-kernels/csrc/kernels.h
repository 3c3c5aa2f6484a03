// Host entry points of the kernels (plain pointers, sizes, a stream): what module.cpp binds.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "format_facts.h"  // format numbers and block facts, generated from b12x_formats

namespace b12x {

// Every GEMV below takes `max_m`, the accumulator bucket (1, 2, 4, 8 or 16 tokens; M <= max_m): b12x_core's
// plan picks it per token range, so register use follows M without the kernels choosing anything.

// y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for m < M <= max_m; W: N rows of K/group raw GGML blocks
// (format FMT_Q8_0, FMT_IQ2_XXS or FMT_IQ2_XS); grid: the IQ2 grid as llama.cpp's uint64 entries (unused for
// Q8_0). Returns the launch error.
cudaError_t gemv_ggml(int format, const uint8_t* w, const uint64_t* grid, const __nv_bfloat16* x,
                      const __nv_bfloat16* bias, __nv_bfloat16* y, int M, int max_m, int N, int K,
                      cudaStream_t stream);

// Element formats: w is the checkpoint's weight bytes (e4m3 [N, K] or packed e2m1 [N, K/2]); scales its block
// scales (FP8_BLOCK: float32 [ceil(N/128), ceil(K/128)]; MX: E8M0 [N, K/32]; NVFP4: E4M3 [N, K/16]; FP8: unused);
// tensor_scale the per-tensor factor (FP8 weight_scale, NVFP4 weight_scale_2, times a static activation
// scale; 1 otherwise). K % 8 == 0.
// x_scale (nullable): float32 activation scales of quantized activations whose codes x holds as bf16 values
// (exact: e4m3 codes), x_scale_cols per token: 1 (per token) or ceil(K/128) (per 128 columns).
// y[m * ldy + n]: a fused layer's shards (each with its own tensor_scale) write their column slices.
cudaError_t gemv_elem(int format, const uint8_t* w, const uint8_t* scales, float tensor_scale,
                      const __nv_bfloat16* x, const float* x_scale, int x_scale_cols, const __nv_bfloat16* bias,
                      __nv_bfloat16* y, int ldy, int M, int max_m, int N, int K, cudaStream_t stream);

// out[t, :] = decoded Q8_0 row ids[t] of a [V, H/Q8_0_GROUP, Q8_0_BYTES] table, bf16.
cudaError_t embedding_q8_0(const uint8_t* table, const void* ids, bool ids_int64, __nv_bfloat16* out, int T,
                           int V, int H, cudaStream_t stream);

}  // namespace b12x
