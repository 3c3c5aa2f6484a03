// The SM90 mixed-input GEMM for MXFP4 weights (sm90_mixed_gemm.cuh): one CUTLASS kernel a token tile, sm_90a only.
#include "sm90_mixed_gemm.cuh"

B12X_SM90_MIXED_KIND(mxfp4, cutlass::float_e2m1_t, MxFp4Scales, true, 16, 64, 128, 256)
