// The SM90 mixed-input GEMM for MXFP4 weights in the checkpoint's layout:
// one CUTLASS kernel a token tile (sm90_mixed_gemm.cuh), sm_90a only.
#include "sm90_mixed_gemm.cuh"

B12X_SM90_MIXED_KIND(mxfp4_plain, cutlass::float_e2m1_t, MxFp4Scales, false, 16, 64, 128, 256)
