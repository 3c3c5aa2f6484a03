// Host entry points of the kernels (plain pointers, sizes, a stream): what module.cpp binds.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "format_facts.h"  // format numbers and block facts, generated from b12x_formats
#include "interface.h"     // the families' argument blocks and the tensor-core geometry, generated from b12x_kernels

namespace b12x {

// Each kernel family takes its argument block (interface.h, built once at prepare time: shapes, layouts, configuration,
// weight pointers) and per call only the activations, bias, output, token count, workspace and stream. Every
// entry point returns the launch error (cudaErrorInvalidValue for a format it does not run).

// GEMVs: M <= args.max_m tokens (b12x_core's plan picks the bucket per token range, so register use follows M
// without the kernels choosing anything).
cudaError_t gemv_ggml(const GemvGgmlArgs& args, const __nv_bfloat16* x, const __nv_bfloat16* bias,
                      __nv_bfloat16* y, int M, cudaStream_t stream);
// x_scale (nullable): float32 activation scales of quantized activations whose codes x holds as bf16 values
// (exact: e4m3 codes), args.x_scale_cols per token.
cudaError_t gemv_elem(const GemvElemArgs& args, const __nv_bfloat16* x, const float* x_scale,
                      const __nv_bfloat16* bias, __nv_bfloat16* y, int M, cudaStream_t stream);

// out[t, :] = decoded Q8_0 row ids[t] of a [V, H/Q8_0_GROUP, Q8_0_BYTES] table, bf16.
cudaError_t embedding_q8_0(const uint8_t* table, const void* ids, bool ids_int64, __nv_bfloat16* out, int T,
                           int V, int H, cudaStream_t stream);

// The tensor-core layout's weight dequantized to bf16 (mma_dequantize.cu): out[n * args.ldy + k] = bf16(W[n, k] ·
// args.row_scale[n]) for n < N, k < K: the checkpoint dequantization's bits, every format. The argument block's token
// tile, splits and epilogue are ignored. mma_dequantize_error: why an argument block cannot run (null: it can).
const char* mma_dequantize_error(const MmaArgs& args);
cudaError_t mma_dequantize(const MmaArgs& args, __nv_bfloat16* out, cudaStream_t stream);

// Tensor-core mixed-input GEMM (mma_gemm.cu) over weights in its repacked tile layout (mma_gemm.cuh's header says
// what each byte holds; the host repacks checkpoint weights into it losslessly at prepare time).
// The epilogue (MmaArgs::epilogue), per output element v = alpha * row_scale[row] * sum_k x·W:
//   MMA_OUT_BF16:  y[m * ldy + n] = bf16(v + bias[n])
//   MMA_OUT_SILU:  rows interleaved 8 gate / 8 up per 16-row tile: y[m * ldy + 8·tile + i] =
//                  bf16(silu(gate row i) · up row i) (N/2 columns)
//   MMA_OUT_RELU2: y[m * ldy + n] = bf16(max(v, 0)²)
//   MMA_OUT_F32:   partials[split, m, n] = v (fp32, no reduction: each K split writes its own slab)
//
// What changes per call:
struct MmaCall {
  const __nv_bfloat16* x;     // [rows, K] (row stride K), 16-byte aligned
  const __nv_bfloat16* bias;  // [N] or null (MMA_OUT_BF16 only)
  __nv_bfloat16* y;           // y[m * ldy + n]
  int M;                      // output rows (tokens, or token slots when grouped)
  float* partials;            // fp32 [splits, M, N]
  int* tickets;               // int [ceil(N / rows) * token tiles] (rows: a CTA's, 16·tiles), zero at rest (the
                              // kernel leaves it zero)
  // Grouped (fused MoE) when `order` is set: the weight stacks experts (expert e owns rows [e·N, (e+1)·N),
  // N % 16 == 0) and token tile b is block b of an expert-sorted block table (every token slot sorted by its
  // expert, cut into blocks of at most 8·mt slots of one expert). `table` is int [3, blocks]: row 0 the
  // block's expert (−1: nothing to do), row 1 its first sorted position, row 2 its slot count (at most 8·mt);
  // sorted position p holds token slot order[p]. A slot's input row is slot / top_k (gather) or the slot
  // itself (top_k 0); its output row is the slot.
  const int* order;
  const int* table;
  int blocks;
  // Grouped and routed in the kernel (mma_gemm only) when `ids` is set instead of `order` and `table`: ids int32 [M],
  // each slot's expert (0 .. experts − 1; M <= MMA_ROUTE_MAX_SLOTS, experts <= MMA_ROUTE_MAX_EXPERTS), and the launch
  // covers `blocks` table blocks (b12x_core.moe_blocks.max_blocks). Each CTA finds its block of the table above
  // itself, so no launch makes the table.
  const int* ids;
  int experts;
  // The fused MoE's combine in the down GEMM (mma_gemm, grouped, MMA_OUT_F32) when set: y bf16 [M / combine_k, N]
  // (contiguous) = Σ_j combine_w[t·combine_k + j] · Σ_s partials[s, t·combine_k + j, :], j and s in order, written
  // by the last CTA of each output tile of a CTA's rows (16·tiles; a ticket each: tickets needs ceil(N / rows)).
  const float* combine_w;
  int combine_k;
};

// CTAs of the kernel that fit one SM of the current device (0 where it cannot run there; the runtime's error is
// cleared): the plan sizes K splits by it.
int mma_blocks_per_sm(int format, int mt, int rt, int tiles);
// Shared memory a CTA with resident activations takes for M rows (MmaArgs::resident; at most 227 KB can run).
int mma_resident_smem_bytes(const MmaArgs& args, int M);
// The dynamic shared memory a CTA of the kernel for (format, token tile 8·mt, `tiles` row tiles) takes: staged
// activations, or with resident_rows > 0 that many rows held over chunks_per_split chunks (mt 1). 0: no such kernel.
// A host computation (no device): the plans keep every CTA within the device's per-block limit (99 KB on SM12x).
int mma_smem_bytes(int format, int mt, int tiles, int resident_rows, int chunks_per_split);
// Why an argument block cannot run (null when it can): checked once per call, before anything launches.
const char* mma_args_error(const MmaArgs& args);
cudaError_t mma_gemm(const MmaArgs& args, const MmaCall& call, cudaStream_t stream);

// The Hopper form of the same GEMM (wgmma_gemm.cu, sm_90a): the same argument block (MmaArgs: mt 1, 2, 4, 8 or 16; rt
// 1) and call (MmaCall; the grouped form with mt 4, 8 or 16), weights, epilogues and split-K reduction; warpgroup MMAs
// with the decoded weights as the register A operand and the token tile (8·mt tokens) as B from shared memory; formats
// whose decode needs no per-chunk fp32 scale (FP8, MXFP8, NVFP4, MXFP4, Q8_0). `staged` is scratch of rows × chunks ×
// the format's chunk K bf16 values (rows = M rounded up to 8, or blocks · 8·mt when grouped): x in the B operand's
// order, gathered per slot when grouped, written by a small kernel before the GEMM (two launches per call). On other
// devices (or a build without sm_90a) it returns cudaErrorNoKernelImageForDevice.
const char* wgmma_args_error(const MmaArgs& args);
int wgmma_blocks_per_sm(int format, int mt);  // 0 on error or off sm_90
cudaError_t wgmma_gemm(const MmaArgs& args, const MmaCall& call, uint8_t* staged, cudaStream_t stream);

// SM12x's block-scaled mma.sync (block_scaled_mma.cuh) once per warp for each of `fragments` fragments: the
// instruction on sm_120a / sm_121a, its emulation elsewhere. `kind` a bsmma::Kind (b12x_kernels.block_scaled_mma
// .kind_id), the selectors one of Table 40's combinations for it. Fragment f, lane l: a[(32f + l)·4 + i],
// b[(32f + l)·2 + i], c and d like a, sfa[32f + l], sfb[32f + l]. block_scaled_mma_probe_error: why the kind and
// selectors cannot run (null: they can).
const char* block_scaled_mma_probe_error(int kind, int byte_id_a, int thread_id_a, int byte_id_b, int thread_id_b);
cudaError_t block_scaled_mma_probe(int kind, const uint32_t* a, const uint32_t* b, const float* c,
                                   const uint32_t* sfa, const uint32_t* sfb, float* d, int fragments, int byte_id_a,
                                   int thread_id_a, int byte_id_b, int thread_id_b, cudaStream_t stream);

// SM12x's block-scaled mma.sync GEMM (bsmma_gemm.cu): x (bf16 [M, K]) quantized into xq / xs (scratch of
// bsmma_x_bytes(kind, M, units, false / true) bytes, 16-byte aligned), then y[m·ldy + n] = row_scale[n] · x̂ · W (+ bias)
// in bf16: two launches. The instruction on sm_120a / sm_121a, its exact model (bsmma::emulate) elsewhere.
// bsmma_args_error: why the argument block cannot run (null: it can).
const char* bsmma_args_error(const BsmmaArgs& args);
size_t bsmma_x_bytes(int kind, int M, int units, bool scales);
cudaError_t bsmma_gemm(const BsmmaArgs& args, const __nv_bfloat16* x, uint8_t* xq, uint8_t* xs,
                       const __nv_bfloat16* bias, __nv_bfloat16* y, int M, cudaStream_t stream);
// Its two launches one at a time. bsmma_quantize: the activation pass alone (not FP8, whose codes come from the fp8
// pass). bsmma_mma: the GEMM on quantized rows xq / xs (FP8: xs unused, x_row_scale its per-row scale or null), y
// float32 where args.out_f32; with `table` (int32 [3, blocks]: b12x_core.moe_blocks) the grouped form, CTA row y one
// table block of sorted rows against its expert's weight (args.expert_codes / expert_scales bytes apart).
cudaError_t bsmma_quantize(const BsmmaArgs& args, const __nv_bfloat16* x, uint8_t* xq, uint8_t* xs, int M,
                           cudaStream_t stream);
cudaError_t bsmma_mma(const BsmmaArgs& args, const uint8_t* xq, const uint8_t* xs, const float* x_row_scale,
                      const int* table, int blocks, const __nv_bfloat16* bias, void* y, int M, cudaStream_t stream);

}  // namespace b12x
