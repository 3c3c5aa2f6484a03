// Programmatic dependent launch (PDL, SM90 and SM12x): a kernel launched with it may start while the kernel before it
// in the stream is still finishing, so its launch, its shared-memory setup and the first copies of its weights overlap
// that kernel's tail. Decode-sized calls are a few microseconds long, so that tail is a large share of them.
//
// The contract every kernel launched through launch_kernel(pdl = true) keeps:
// - Before grid_dependency_wait() it reads only what no kernel writes: its argument block and its weights (prepared
//   once). It writes nothing to global memory and reads no activation, block table, ticket or workspace.
// - Every CTA calls grid_dependency_wait() before it reads or writes anything else, or before it returns: the wait
//   returns once the previous kernel has finished and its writes are visible, so a kernel's completion implies its
//   predecessor's, and the chain stays ordered as a plain stream is (bit-identical results, CUDA graphs included).
// - grid_dependents_launch() lets the next kernel be scheduled once every CTA of this one has called it (or ended);
//   the kernels call it after their main loop. Called first thing instead, the next kernel's CTAs took room on the SMs
//   early and waited there: NVFP4 and FP8 at 1-4 tokens ran 20-25% slower (`benchmarks/mma_linear.py --model 8b
//   --pdl-ab` on a build with the call moved).
// Without PDL (or on a kernel without a programmatic predecessor) both are no-ops.
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace b12x {

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Brings one 128-byte line of read-only data toward L2 (no register, no completion to wait for).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when `pdl`: the launch
// error.
template <class... Params, class... Args>
cudaError_t launch_kernel(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  if (pdl) {
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// CTAs of `kernel` (`threads` a CTA, `bytes` of dynamic shared memory) that one SM of the current device holds; 0
// where it cannot run there (its shared memory past the block's limit: SM12x's 99 KB for IQ2_XS's 128-row CTA, FP4
// at 32-token tiles). The runtime keeps that refusal as the thread's last error, and a later `return
// cudaGetLastError()` after a launch would report it as its own (the plans ask here while they are made), so the
// refusal is taken back here: a question, not a failure.
template <class... Params>
int blocks_per_sm_of(void (*kernel)(Params...), int threads, int bytes) {
  int blocks = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return blocks;
}

}  // namespace b12x
