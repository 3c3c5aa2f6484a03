// The grouped SM90 mixed-input GEMM of the fused MoE for NVFP4 experts (sm90_moe_gemm.cuh): one CUTLASS kernel,
// sm_90a only.
#include "sm90_moe_gemm.cuh"

B12X_SM90_MOE_KIND(nvfp4, NvFp4Scales)
