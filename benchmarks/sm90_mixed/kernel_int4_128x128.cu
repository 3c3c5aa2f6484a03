#include "mixed_kernel.hpp"
SM90_MIXED_DEFINE_KERNEL(int4_128x128, cutlass::int4b_t, 128, 128, 64, WeightType::INT4,
                         "int4 (s4) W x bf16 X -> bf16, ConvertAndScale, bf16 scales per 128 k (no zeros); "
                         "tile 128(N)x128(M)x64, cluster 1x1, KernelTmaWarpSpecializedCooperative, StreamKScheduler")
