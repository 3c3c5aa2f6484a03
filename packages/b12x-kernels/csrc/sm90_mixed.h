// The Hopper mixed-input GEMM built on CUTLASS's SM90 pieces (sm90_mixed_*.cu): the plain interface module.cpp
// binds. No CUTLASS types here, so module.cpp compiles without the CUTLASS headers and each kernel is its own
// translation unit (one CUTLASS kernel takes minutes and gigabytes to compile).
//
// Y[M, N] = (X[M, K] . W[N, K]^T) * alpha[n] + bias[n], X / Y / bias bf16 row-major, fp32 accumulation. W is in the
// kernel's layout (sm90_mixed_reorder), its block scales in the tile layout (one carrier per weight row and 64-deep
// k-tile, [K / 64][N], N fastest).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace b12x::sm90 {

// The weight codes a kernel converts in registers, and their block scales. Values are the binding's: keep in step
// with b12x_kernels.sm90_mixed.WEIGHTS.
enum class MixedWeight : int {
  E4M3 = 0,   // FP8: e4m3 codes, no block scales (the per-tensor factor is alpha); either layout
  NVFP4 = 1,  // e2m1 codes, an e4m3 scale per 16 k (4 a k-tile); the global factor is alpha
  MXFP4 = 2,  // e2m1 codes, an e8m0 scale per 32 k (2 a k-tile)
  MXFP8 = 3,  // e4m3 codes, an e8m0 scale per 32 k (2 a k-tile)
  Q8_0 = 4,   // int8 codes (GGML Q8_0's q), an fp16 d per 32 k (2 a k-tile)
};
// Every kind has kernels for the reordered layout; E4M3 alone for the checkpoint's too (the plans hold FP8's
// checkpoint copy; the 4-bit kinds' checkpoint kernels were slower than their reordered ones at every M and shape of the
// H100 tables, and an FP4 plan holds the mma layout or the reordered one, so none picked those).

// How the persistent tile scheduler splits the work: a run-time choice of one compiled kernel.
enum class Decomposition : int { DataParallel = 0, Heuristic = 1, StreamK = 2 };

// The tile's tokens a kernel exists for (each kind and layout has all): 16 for decode-sized calls, where a wider tile's
// padded MMAs would cost more than reading the weight; 64 for small batches; 128; 256 for prefill, which converts each
// weight tile once for twice the tokens. Keep in step with b12x_kernels.interface.SM90_MIXED.token_tiles.
constexpr int kMixedTokenTiles[] = {16, 64, 128, 256};

struct MixedGemmArgs {
  int weight = 0;  // MixedWeight
  int m = 0, n = 0, k = 0;
  const void* w = nullptr;       // codes in the kernel's layout
  const void* scales = nullptr;  // all but E4M3: the tile-layout block scales (Q8_0: its fp16 d's)
  const void* x = nullptr;       // bf16 [m, k]
  void* y = nullptr;             // bf16 [m, n]
  const float* alpha = nullptr;  // float32 [n]
  const void* bias = nullptr;    // bf16 [n] or null
  int decomposition = 1;         // Decomposition
  int reordered = 1;             // 1: w in sm90_mixed_reorder's layout; 0: the checkpoint's (K-major rows; E4M3 only)
  int sms = 0;                   // SMs the persistent grid covers (the device's count)
  int tokens = 128;              // the tile's tokens: one of kMixedTokenTiles
};

// The shape rules every weight kind shares (kind, m, n, k, decomposition, sms, tokens); null when they hold.
const char* mixed_shape_error(const MixedGemmArgs& args);
// The shape rules and the pointers' (non-null, 16-byte aligned); null when the arguments are valid.
const char* mixed_args_error(const MixedGemmArgs& args);
// Bytes of the scratch the scheduler needs (stream-K partials and barriers), from the shape alone.
size_t mixed_workspace_bytes(const MixedGemmArgs& args);
// Enqueues the GEMM (a memset of the scheduler's barriers when it has any, then the kernel): graph-capturable.
cudaError_t mixed_gemm(const MixedGemmArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream);
// Logical codes W[n][k] (K-major; 4-bit codes two a byte, even k in the low nibble; Q8_0: its int8 q's without the
// d's) -> the kernel's layout, into a distinct buffer of the same size.
cudaError_t mixed_reorder(int weight, const void* src, void* dst, int n, int k, cudaStream_t stream);
// Whether this build holds the kernels (they are compiled for sm_90a only, when the build targets sm_90).
bool mixed_built();

}  // namespace b12x::sm90
