// The grouped (fused-MoE) form of the Hopper mixed-input GEMM (sm90_moe_*.cu, on CUTLASS's SM90 ptr-array
// collective): the plain interface module.cpp binds. No CUTLASS types here (as sm90_mixed.h).
//
// One launch multiplies every expert's rows of an expert-sorted activation matrix by that expert's weight:
//   Y[r, :] = X[r, :] . W[e]^T   for r in [offsets[e], offsets[e + 1]),   fp32 accumulation, float32 or bf16 out,
// X bf16 row-major [rows, K], Y row-major [rows, N], W [E, N, K] e2m1 codes in the checkpoint's layout (K-major rows, even k
// in the low nibble), its block scales as the linear's carriers per expert ([E][K / 64][N], N fastest). Per-row
// factors are the caller's (no epilogue scaling). `offsets` (int32 [E + 1], offsets[0] = 0, ascending) lives in device
// memory: a small kernel writes CUTLASS's per-expert problem shapes, pointers and strides from it into the workspace,
// then the grouped GEMM runs over them, so a call needs no host synchronisation and is CUDA-graph capturable. Experts
// with no rows have no tiles.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace b12x::sm90 {

struct MoeGemmArgs {
  int weight = 0;  // MixedWeight: NVFP4 or MXFP4
  int experts = 0, n = 0, k = 0;
  const void* w = nullptr;       // codes [E, N, K / 2]
  const void* scales = nullptr;  // carriers [E, K / 64, N, 64 / group]
  const void* x = nullptr;       // bf16 [rows, K], rows sorted by expert
  void* y = nullptr;             // [rows, N]: float32 (y_float) or bf16
  int y_float = 0;
  const int* offsets = nullptr;  // int32 [E + 1] in device memory: expert e's rows
  int sms = 0;                   // SMs the persistent grid covers (the device's count)
};

// The shape rules (kind, experts, n, k, sms); null when they hold.
const char* moe_shape_error(const MoeGemmArgs& args);
// The shape rules and the pointers' (non-null, 16-byte aligned); null when the arguments are valid.
const char* moe_args_error(const MoeGemmArgs& args);
// Bytes of the workspace a call takes (the per-expert problem table and CUTLASS's TMA descriptors), from the shape.
size_t moe_workspace_bytes(const MoeGemmArgs& args);
// Enqueues the problem-table kernel, then the grouped GEMM: graph-capturable.
cudaError_t moe_gemm(const MoeGemmArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace b12x::sm90
