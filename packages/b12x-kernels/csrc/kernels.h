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

// Tensor-core mixed-input GEMM (mma_gemm.cu) over weights in its repacked tile layout (mma_gemm.cuh's header says
// what each byte holds; the host repacks checkpoint weights into it losslessly at prepare time).
// What the result becomes (the epilogue), per output element v = alpha * row_scale[row] * sum_k x·W:
enum MmaOut : int {
  MMA_OUT_BF16 = 0,   // y[m * ldy + n] = bf16(v + bias[n])
  MMA_OUT_SILU = 1,   // rows interleaved 8 gate / 8 up per 16-row tile: y[m * ldy + 8·tile + i] =
                      //   bf16(silu(gate row i) · up row i) (N/2 columns)
  MMA_OUT_RELU2 = 2,  // y[m * ldy + n] = bf16(max(v, 0)²)
  MMA_OUT_F32 = 3,    // partials[split, m, n] = v (fp32, no reduction: each K split writes its own slab)
};

struct MmaArgs {
  int format;                 // FMT_* (format_facts.h)
  const uint8_t* codes;       // code tiles (16 rows × one chunk of K, lane order), 16-byte aligned
  const uint8_t* meta;        // per (row, chunk) block-scale bytes, row-blocked; null for FP8 / FP8_BLOCK
  const uint8_t* meta2;       // IQ2_XS: sub-block scale bytes per (row, chunk)
  const float* block_scale;   // FP8_BLOCK: float32 [ceil(N/128), ceil(K/128)]
  const uint32_t* tables;     // IQ2: grid nibble codes, then 128 sign nibble masks
  float alpha;                // per-tensor scale of the result
  float scale_mul;            // power of two multiplying block scales in the decode (alpha holds its inverse)
  const float* row_scale;     // per weight row (of the stacked weight) factor of the result, or null
  const __nv_bfloat16* x;     // [rows, K] (row stride K), 16-byte aligned
  const __nv_bfloat16* bias;  // [N] or null (MMA_OUT_BF16 only)
  __nv_bfloat16* y;           // y[m * ldy + n]
  int ldy, M, N, K;           // M: output rows (tokens, or token slots when grouped); N: weight rows (per expert)
  int chunks;                 // K chunks in the repacked weight (K padded to mma_chunk_k)
  int mt;                     // token tile = 8 * mt tokens (1, 2 or 4)
  int rt;                     // row tiles of 16 per warp (1 or 2): 8/rt warps per CTA
  int splits;                 // K splits; > 1 needs partials (and tickets unless MMA_OUT_F32)
  float* partials;            // fp32 [splits, M, N]
  int* tickets;               // int [ceil(N/128) * token tiles], zero at rest (the kernel leaves it zero)
  int epilogue;               // MmaOut
  // Grouped (fused MoE) when `order` is set: the weight stacks experts (expert e owns rows [e·N, (e+1)·N),
  // N % 16 == 0) and token tile b is block b of an expert-sorted block table (every token slot sorted by its
  // expert, cut into blocks of at most 8·mt slots of one expert): expert block_expert[b] (−1: nothing to do),
  // sorted positions block_start[b] .. + block_rows[b]
  // (at most 8·mt), each holding a token slot order[pos]. A slot's input row is slot / top_k (gather) or the
  // slot itself (top_k 0); its output row is the slot.
  const int* order;
  const int* block_expert;
  const int* block_start;
  const int* block_rows;
  int blocks;
  int top_k;
};

// K elements per chunk for a format (0 if unknown).
int mma_chunk_k(int format);
// CTAs of the kernel that fit one SM of the current device (0 on error): the plan sizes K splits by it.
int mma_blocks_per_sm(int format, int mt, int rt);
cudaError_t mma_gemm(const MmaArgs& args, cudaStream_t stream);

}  // namespace b12x
