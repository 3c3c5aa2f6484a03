// The decode-sized GEMM on the Hopper CUTLASS family's weight layout (csrc/sm90_mixed_layout.cuh, "sm90"): mma.sync
// m16n8k16 with the weight as A, read straight from global memory in the order the layout already keeps it (each
// lane's A fragment of a 16-row, 16-deep block is one 32-bit word), so a plan that holds that layout for prefill has a
// kernel for decode-sized calls on the same copy. No CUTLASS types here: module.cpp binds it.
//
// Y[M, N] = (X[M, K] . W[N, K]^T) * alpha[n] * alpha_shift + bias[n], X / Y / bias bf16 row-major, fp32 accumulation.
// The codes are sm90_mixed_reorder's, the block scales the CUTLASS family's carriers ([K/64][N], 4 e4m3 or 2 e8m0
// bytes each). Each weight is decoded as value * 2^-126 bit patterns times (block scale * scale_mul) in one bf16
// multiply, which is exact while every product value * block scale * scale_mul * 2^-126 is a normal bf16 (the mma
// family's contract, b12x_core.tensor_core.layout.decode_range); alpha_shift takes scale_mul's 2^(126 - e) back.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace b12x::fragment {

// The weight kinds it decodes: sm90::MixedWeight's values (b12x_kernels.interface.SM90_MIXED_WEIGHTS).
enum class FragmentWeight : int { NVFP4 = 1, MXFP4 = 2 };

// Tokens one CTA multiplies a pass: 4 (16-row CTAs whose warps split K), 8, 16 or 32 (128-row CTAs: one, two or four
// n8 MMAs a k-block); a call of more tokens runs ceil(M / tokens) passes over the weight, one grid row each. Keep in
// step with interface.FRAGMENT_MMA.token_tiles.
constexpr int kFragmentTokenTiles[] = {4, 8, 16, 32};

struct FragmentArgs {
  int weight = 0;                // FragmentWeight
  int m = 0, n = 0, k = 0;       // N, K multiples of 64 (the layout's tiles)
  const void* w = nullptr;       // codes in sm90_mixed_reorder's layout
  const void* scales = nullptr;  // carriers [K/64][N] (4 bytes NVFP4, 2 bytes MXFP4)
  const void* x = nullptr;       // bf16 [m, k], 16-byte aligned
  void* y = nullptr;             // bf16 [m, n]
  const float* alpha = nullptr;  // float32 [n]
  const void* bias = nullptr;    // bf16 [n] or null
  float scale_mul = 0.f;         // block scale multiplier: 2^(126 - e)
  float alpha_shift = 0.f;       // 2^e
  int tokens = 8;                // one of kFragmentTokenTiles
  int splits = 1;                // K splits across CTAs (1 .. K/64): enough CTAs of 128 rows to fill the GPU
  float* partials = nullptr;     // splits > 1: fragment_partial_floats(...) floats of scratch
  int* tickets = nullptr;        // splits > 1: fragment_tickets(...) int32s, zero at rest (the kernel leaves them zero)
};

// Null when the arguments hold, else the rule they break.
const char* fragment_args_error(const FragmentArgs& args);
// Float32 partials a split call needs (0 without a split), and its tickets.
size_t fragment_partial_floats(int m, int n, int splits, int tokens);
int fragment_tickets(int m, int n, int splits, int tokens);
// Enqueues the GEMM (one kernel, graph-capturable).
cudaError_t fragment_gemm(const FragmentArgs& args, cudaStream_t stream);

}  // namespace b12x::fragment
