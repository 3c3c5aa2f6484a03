// The SM90 mixed-input GEMM's entry points in a build that does not target sm_90 (no CUTLASS kernels compiled):
// module.cpp binds these, and sm90_mixed_built tells the caller before any other is reached.
#include "sm90_mixed.h"
#include "sm90_moe.h"

namespace b12x::sm90 {

bool mixed_built() { return false; }
const char* mixed_shape_error(const MixedGemmArgs&) { return "this build holds no sm_90a kernels"; }
const char* mixed_args_error(const MixedGemmArgs&) { return "this build holds no sm_90a kernels"; }
size_t mixed_workspace_bytes(const MixedGemmArgs&) { return 0; }
cudaError_t mixed_gemm(const MixedGemmArgs&, void*, size_t, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t mixed_reorder(int, const void*, void*, int, int, cudaStream_t) { return cudaErrorNotSupported; }
const char* moe_shape_error(const MoeGemmArgs&) { return "this build holds no sm_90a kernels"; }
const char* moe_args_error(const MoeGemmArgs&) { return "this build holds no sm_90a kernels"; }
size_t moe_workspace_bytes(const MoeGemmArgs&) { return 0; }
cudaError_t moe_gemm(const MoeGemmArgs&, void*, size_t, cudaStream_t) { return cudaErrorNotSupported; }

}  // namespace b12x::sm90
