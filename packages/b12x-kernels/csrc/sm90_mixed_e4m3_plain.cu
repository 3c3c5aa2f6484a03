// The SM90 mixed-input GEMM for FP8 (e4m3) weights in the checkpoint's layout:
// one CUTLASS kernel a token tile (sm90_mixed_gemm.cuh), sm_90a only.
#include "sm90_mixed_gemm.cuh"

B12X_SM90_MIXED_KIND(e4m3_plain, cutlass::float_e4m3_t, void, false, 16, 64, 128, 256)
