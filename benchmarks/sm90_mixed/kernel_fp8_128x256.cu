#include "mixed_kernel.hpp"
SM90_MIXED_DEFINE_KERNEL(fp8_128x256, cutlass::float_e4m3_t, 128, 256, 64, WeightType::FP8,
                         "e4m3 W x bf16 X -> bf16, ConvertOnly, alpha = per-tensor scale in the epilogue; "
                         "tile 128(N)x256(M)x64, cluster 1x1, KernelTmaWarpSpecializedCooperative, StreamKScheduler")
