// The plain interface between the benchmark driver (mixed_gemm.cu) and the CUTLASS kernels (kernel_*.cu).
// No CUTLASS types here, so the driver compiles fast and each kernel is its own translation unit.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

namespace sm90mixed {

// How the stream-K tile scheduler splits the work (a runtime argument of one compiled kernel).
enum class Decomp { DataParallel = 0, Heuristic = 1, StreamK = 2 };

inline const char* decomp_name(Decomp d) {
  switch (d) {
    case Decomp::DataParallel: return "dp";
    case Decomp::Heuristic: return "heur";
    case Decomp::StreamK: return "sk";
  }
  return "?";
}

// Y[M, N] = X[M, K] . W[N, K]^T (bf16 out, row-major; fp32 accumulation).
struct MixedProblem {
  int M = 0, N = 0, K = 0;
  const void* W = nullptr;       // the weight in the kernel's layout (reorder_weight's output)
  const void* X = nullptr;       // bf16, M x K, row-major
  void* Y = nullptr;             // bf16, M x N, row-major
  const void* scales = nullptr;  // int4 only: bf16 [K / group][N] (N fastest)
  int group = 0;                 // int4 only
  float alpha = 1.f;             // epilogue scale (fp8: the per-tensor weight scale)
  int device = 0;
  int sm_count = 0;
  Decomp decomp = Decomp::Heuristic;
};

struct GemmPlan {
  virtual ~GemmPlan() = default;
  // Enqueues the GEMM on stream s (capturable: a memset of the stream-K barriers, when the decomposition
  // needs them, then the kernel). Returns false and fills err on failure.
  virtual bool enqueue(cudaStream_t s, std::string& err) = 0;
};

enum class WeightType { FP8 = 0, INT4 = 1 };

struct KernelEntry {
  const char* name;        // e.g. "fp8_128x128"
  WeightType weight;
  const char* description;  // types, tile, schedule, scale mode
  // nullptr (and err) when can_implement, workspace allocation or initialize fails.
  std::unique_ptr<GemmPlan> (*make)(const MixedProblem& p, std::string& err);
};

// One per kernel translation unit.
const KernelEntry& kernel_fp8_128x128();
const KernelEntry& kernel_fp8_128x256();
const KernelEntry& kernel_int4_128x128();
const KernelEntry& kernel_int4_128x256();

// reorder.cu: logical W (N x K, K-major; int4 packed two a byte, even k in the low nibble) -> the layout the
// kernels of that weight type read. src and dst are distinct device buffers. Synchronizes the device.
bool reorder_weight(WeightType t, const void* src, void* dst, int N, int K, std::string& err);
bool weight_is_shuffled(WeightType t);
const char* cutlass_version_string();  // "major.minor.patch" of the headers the kernels were built with

}  // namespace sm90mixed
