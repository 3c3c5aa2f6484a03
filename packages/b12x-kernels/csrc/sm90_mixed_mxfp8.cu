// The SM90 mixed-input GEMM for MXFP8 weights (sm90_mixed_gemm.cuh): one CUTLASS kernel a token tile, sm_90a only.
#include "sm90_mixed_gemm.cuh"

B12X_SM90_MIXED_KIND(mxfp8, cutlass::float_e4m3_t, MxFp8Scales, true, 16, 64, 128, 256)
