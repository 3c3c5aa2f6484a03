// The SM90 mixed-input GEMM for Q8_0 weights (sm90_mixed_gemm.cuh): one CUTLASS kernel a token tile, sm_90a only.
#include "sm90_mixed_gemm.cuh"

B12X_SM90_MIXED_KIND(q8_0, int8_t, Q8Deltas, true, 16, 64, 128, 256)
