// SM90 mixed-input GEMM probe: CUTLASS's stock mixed-input collective (e4m3 x bf16, int4 x bf16) against a
// cuBLAS bf16 GEMM, on the four linears of a Llama-3.1-8B decoder layer, in one program.
//
//   mixed_gemm OUT.json [--reps 60] [--warmup 5] [--ms 128,256,512,1024,4096] [--skip k1,k2] [--no-check]
//   mixed_gemm OUT.json --json-selftest   (no GPU: synthetic numbers through the tables and the JSON writer)
//
// Y[M, N] = X[M, K] . W[N, K]^T, X and Y bf16 row-major, fp32 accumulation.
//  - cublas_bf16: cublasGemmEx, bf16 W, CUBLAS_COMPUTE_32F, default algorithm, 32 MiB workspace.
//  - fp8_*: e4m3 W (per-tensor scale alpha, applied in the epilogue), see mixed_kernel.hpp.
//  - int4_*: signed int4 W with a bf16 scale per 128 k of each row, see mixed_kernel.hpp.
// Each CUTLASS kernel runs under three decompositions of its stream-K scheduler (dp, heur, sk).
//
// Timing: per (variant, M), one CUDA graph holds the four linears of four layer copies (16 GEMMs, 4 copies of
// every weight and scale: 1.7 GB bf16, 0.9 GB e4m3, 0.5 GB int4, all beyond the 50 MB L2); each replay is
// timed with its own CUDA events, the median over --reps replays after --warmup, divided by 4 = one layer.
// Per linear: one graph per linear over its 4 copies, same median / 4 (the smallest int4 weight, 8 MB, has
// 32 MB over 4 copies, so it may partly stay in L2 there; the layer graph has no such caveat).
// Correctness, before timing: every variant at every M and linear, output poisoned with NaN (0xFFFF), against
// a naive fp32 CUDA GEMM on the dequantized weight (copy 0); relative L2 error, max |err|, non-finite count.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sm90_mixed.h"

using namespace sm90mixed;
using bf16 = __nv_bfloat16;

namespace {

// ------------------------------------------------------------------------------------------------ config

struct Linear {
  const char* name;
  int N, K;
};
const Linear kLinears[4] = {{"qkv_proj", 6144, 4096}, {"o_proj", 4096, 4096}, {"gate_up_proj", 28672, 4096},
                            {"down_proj", 4096, 14336}};
constexpr int kCopies = 4;
constexpr int kGroup = 128;
constexpr float kFp8Alpha = 0.03125f;
constexpr double kCheckRelL2 = 1e-2;
constexpr double kHangSeconds = 30.0;

enum class Fmt { BF16 = 0, FP8 = 1, INT4 = 2 };
const char* fmt_name(Fmt f) { return f == Fmt::BF16 ? "bf16" : (f == Fmt::FP8 ? "fp8" : "int4"); }

struct Options {
  std::string json;
  int reps = 60, warmup = 5;
  std::vector<int> ms = {128, 256, 512, 1024, 4096};
  std::vector<std::string> skip;
  bool check = true;
  bool json_selftest = false;  // no GPU: synthetic results through the JSON writer and the tables
};

// ------------------------------------------------------------------------------------------------ errors

std::string g_json_path;
std::string g_current_group = "setup";
std::function<void()> g_flush_json;

[[noreturn]] void fatal_fault(const std::string& what) {
  fprintf(stderr, "FATAL (%s): %s\n", g_current_group.c_str(), what.c_str());
  fflush(stderr);
  if (!g_json_path.empty()) {
    FILE* f = fopen((g_json_path + ".fault").c_str(), "w");
    if (f) {
      fprintf(f, "%s\n", g_current_group.c_str());
      fclose(f);
    }
  }
  if (g_flush_json) g_flush_json();
  fflush(stdout);
  _exit(3);
}

// A CUDA error: recoverable (a bad argument) or sticky (the context is gone). Sticky -> fault and exit, so that
// build_and_run.sh can run again without this kernel.
bool cuda_ok(cudaError_t e, const char* what, std::string* err = nullptr) {
  if (e == cudaSuccess) return true;
  std::string msg = std::string(what) + ": " + cudaGetErrorString(e);
  cudaGetLastError();
  cudaError_t again = cudaDeviceSynchronize();
  if (again != cudaSuccess) fatal_fault(msg + " (sticky: " + cudaGetErrorString(again) + ")");
  if (err) *err = msg;
  else fprintf(stderr, "CUDA error: %s\n", msg.c_str());
  return false;
}

#define CK_SETUP(expr)                                                                  \
  do {                                                                                  \
    cudaError_t e_ = (expr);                                                            \
    if (e_ != cudaSuccess) fatal_fault(std::string(#expr) + ": " + cudaGetErrorString(e_)); \
  } while (0)

// Waits for the stream without hanging: a kernel that never ends is a fault after kHangSeconds.
bool sync_stream(cudaStream_t s, const char* what, std::string* err = nullptr) {
  auto t0 = std::chrono::steady_clock::now();
  while (true) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) return cuda_ok(e, what, err);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > kHangSeconds) fatal_fault(std::string(what) + ": no completion after " + std::to_string(kHangSeconds) + " s (hang)");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// ------------------------------------------------------------------------------------------------ data

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return uint32_t(x);
}
__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t i) {
  return (hash32(seed * 0x9E3779B97F4A7C15ULL + i) >> 8) * (1.0f / 16777216.0f);
}

__global__ void fill_bf16(bf16* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(lo + (hi - lo) * uniform01(seed, i));
}
__global__ void fill_fp8(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    __nv_fp8_e4m3 v(-2.0f + 4.0f * uniform01(seed, i));
    p[i] = v.__x;
  }
}
// Two signed int4 a byte, even k in the low nibble (CUTLASS's int4b_t packing); values -8..7.
__global__ void fill_int4(uint8_t* p, size_t nbytes, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nbytes; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t(hash32(seed * 0x9E3779B97F4A7C15ULL + i) & 0xFFu);
}

template <Fmt F>
__device__ __forceinline__ float dequant(const void* W, const bf16* S, float alpha, int N, int K, int n, int k) {
  size_t i = size_t(n) * K + k;
  if constexpr (F == Fmt::BF16) {
    return __bfloat162float(static_cast<const bf16*>(W)[i]);
  } else if constexpr (F == Fmt::FP8) {
    __nv_fp8_e4m3 v;
    v.__x = static_cast<const uint8_t*>(W)[i];
    return float(v) * alpha;
  } else {
    uint32_t b = static_cast<const uint8_t*>(W)[i >> 1];
    int q = int((b >> ((i & 1) * 4)) & 0xFu);
    q = q >= 8 ? q - 16 : q;
    return float(q) * __bfloat162float(S[size_t(k / kGroup) * N + n]);
  }
}

// Naive tiled fp32 reference: Yref[M, N] = X . dequant(W)^T. 64x64 outputs a block, 4x4 a thread.
template <Fmt F>
__global__ void __launch_bounds__(256) ref_gemm(const bf16* X, const void* W, const bf16* S, float alpha, float* Y,
                                                int M, int N, int K) {
  __shared__ float xs[16][65];
  __shared__ float ws[16][65];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += 16) {
    for (int e = threadIdx.x; e < 64 * 16; e += 256) {
      int r = e / 16, c = e % 16;
      int m = m0 + r, n = n0 + r, k = k0 + c;
      xs[c][r] = (m < M && k < K) ? __bfloat162float(X[size_t(m) * K + k]) : 0.f;
      ws[c][r] = (n < N && k < K) ? dequant<F>(W, S, alpha, N, K, n, k) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[c][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[c][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m < M && n < N) Y[size_t(m) * N + n] = acc[i][j];
    }
}

struct CheckAcc {
  double err2, ref2;
  unsigned int max_err_bits;
  unsigned long long nonfinite;
};

__global__ void compare(const bf16* Y, const float* R, size_t n, CheckAcc* acc) {
  double e2 = 0, r2 = 0;
  float mx = 0;
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float y = __bfloat162float(Y[i]), r = R[i];
    if (!isfinite(y)) {
      ++bad;
      continue;
    }
    double d = double(y) - double(r);
    e2 += d * d;
    r2 += double(r) * double(r);
    mx = fmaxf(mx, fabsf(y - r));
  }
  for (int o = 16; o > 0; o >>= 1) {
    e2 += __shfl_down_sync(0xffffffffu, e2, o);
    r2 += __shfl_down_sync(0xffffffffu, r2, o);
    mx = fmaxf(mx, __shfl_down_sync(0xffffffffu, mx, o));
    bad += __shfl_down_sync(0xffffffffu, bad, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&acc->err2, e2);
    atomicAdd(&acc->ref2, r2);
    atomicMax(&acc->max_err_bits, __float_as_uint(mx));
    atomicAdd(&acc->nonfinite, bad);
  }
}

// ------------------------------------------------------------------------------------------------ weights

struct Weights {
  // [linear][copy]
  void* bf16w[4][kCopies] = {};
  void* fp8w[4][kCopies] = {};   // kernel layout
  void* int4w[4][kCopies] = {};  // kernel layout
  void* scales[4][kCopies] = {};
  void* fp8_logical[4] = {};     // copy 0's values, plain K-major: the reference reads these
  void* int4_logical[4] = {};
};

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  CK_SETUP(cudaMalloc(&p, bytes));
  return p;
}

void make_weights(Weights& w) {
  const dim3 grid(1024), block(256);
  for (int l = 0; l < 4; ++l) {
    const size_t nk = size_t(kLinears[l].N) * kLinears[l].K;
    const size_t ns = size_t(kLinears[l].N) * (kLinears[l].K / kGroup);
    for (int c = 0; c < kCopies; ++c) {
      w.bf16w[l][c] = dev_alloc(nk * 2);
      fill_bf16<<<grid, block>>>(static_cast<bf16*>(w.bf16w[l][c]), nk, 100 + 10 * l + c, -0.05f, 0.05f);
      w.fp8w[l][c] = dev_alloc(nk);
      w.int4w[l][c] = dev_alloc(nk / 2);
      w.scales[l][c] = dev_alloc(ns * 2);
      fill_bf16<<<grid, block>>>(static_cast<bf16*>(w.scales[l][c]), ns, 300 + l, 0.005f, 0.02f);
    }
    w.fp8_logical[l] = dev_alloc(nk);
    fill_fp8<<<grid, block>>>(static_cast<uint8_t*>(w.fp8_logical[l]), nk, 200 + l);
    w.int4_logical[l] = dev_alloc(nk / 2);
    fill_int4<<<grid, block>>>(static_cast<uint8_t*>(w.int4_logical[l]), nk / 2, 400 + l);
    CK_SETUP(cudaGetLastError());
    CK_SETUP(cudaDeviceSynchronize());
    std::string err;
    if (!reorder_weight(WeightType::FP8, w.fp8_logical[l], w.fp8w[l][0], kLinears[l].N, kLinears[l].K, err) ||
        !reorder_weight(WeightType::INT4, w.int4_logical[l], w.int4w[l][0], kLinears[l].N, kLinears[l].K, err))
      fatal_fault("weight reorder, " + std::string(kLinears[l].name) + ": " + err);
    for (int c = 1; c < kCopies; ++c) {
      CK_SETUP(cudaMemcpy(w.fp8w[l][c], w.fp8w[l][0], nk, cudaMemcpyDeviceToDevice));
      CK_SETUP(cudaMemcpy(w.int4w[l][c], w.int4w[l][0], nk / 2, cudaMemcpyDeviceToDevice));
    }
  }
  CK_SETUP(cudaDeviceSynchronize());
}

// ------------------------------------------------------------------------------------------------ variants

struct CublasPlan final : GemmPlan {
  cublasHandle_t h;
  int M, N, K;
  const void *W, *X;
  void* Y;
  bool enqueue(cudaStream_t, std::string& err) override {
    const float alpha = 1.f, beta = 0.f;
    // Column-major view: Y^T (N x M) = W^T' (op T of the K x N buffer) . X^T (K x M).
    cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W, CUDA_R_16BF, K, X, CUDA_R_16BF,
                                     K, &beta, Y, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
      err = std::string("cublasGemmEx: ") + cublasGetStatusString(st);
      return false;
    }
    return true;
  }
};

struct Variant {
  std::string name;   // "cublas_bf16", "fp8_128x128/heur", ...
  std::string group;  // what a fault skips: "cublas_bf16" or the kernel's name
  Fmt fmt;
  const KernelEntry* kernel = nullptr;
  Decomp decomp = Decomp::Heuristic;
};

struct Ctx {
  Weights w;
  bf16* X = nullptr;
  bf16* Y = nullptr;
  float* Yref = nullptr;
  CheckAcc* acc = nullptr;
  cublasHandle_t cublas = nullptr;
  void* cublas_ws = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0, sm_count = 0;
};

std::unique_ptr<GemmPlan> make_plan(Ctx& cx, const Variant& v, int l, int c, int M, std::string& err) {
  const Linear& L = kLinears[l];
  if (v.fmt == Fmt::BF16) {
    auto p = std::make_unique<CublasPlan>();
    p->h = cx.cublas;
    p->M = M, p->N = L.N, p->K = L.K;
    p->W = cx.w.bf16w[l][c], p->X = cx.X, p->Y = cx.Y;
    return p;
  }
  MixedProblem p;
  p.M = M, p.N = L.N, p.K = L.K;
  p.X = cx.X, p.Y = cx.Y;
  p.device = cx.device, p.sm_count = cx.sm_count, p.decomp = v.decomp;
  if (v.fmt == Fmt::FP8) {
    p.W = cx.w.fp8w[l][c];
    p.alpha = kFp8Alpha;
  } else {
    p.W = cx.w.int4w[l][c];
    p.scales = cx.w.scales[l][c];
    p.group = kGroup;
    p.alpha = 1.f;
  }
  auto plan = v.kernel->make(p, err);
  if (!plan) cudaGetLastError();
  return plan;
}

// ------------------------------------------------------------------------------------------------ results

struct CheckResult {
  bool done = false;
  double rel_l2 = NAN, max_abs = NAN;
  unsigned long long nonfinite = 0;
  std::string error;
  bool ok() const { return done && error.empty() && nonfinite == 0 && rel_l2 < kCheckRelL2; }
};

struct MResult {
  double layer_us = NAN;
  double linear_us[4] = {NAN, NAN, NAN, NAN};
  CheckResult check[4];
  std::string error;
  bool checked_ok(bool check_enabled) const {
    if (!check_enabled) return true;
    for (const auto& c : check)
      if (!c.ok()) return false;
    return true;
  }
};

std::map<std::string, std::map<int, MResult>> g_results;
std::vector<std::string> g_faults_skipped;

// ------------------------------------------------------------------------------------------------ timing

// Captures body into a graph, replays it warmup times, then times reps replays one by one; median in ms.
bool time_graph(Ctx& cx, const std::function<bool(cudaStream_t, std::string&)>& body, int reps, int warmup,
                double& median_ms, std::string& err) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  if (!cuda_ok(cudaStreamBeginCapture(cx.stream, cudaStreamCaptureModeThreadLocal), "begin capture", &err)) return false;
  bool body_ok = body(cx.stream, err);
  cudaError_t ec = cudaStreamEndCapture(cx.stream, &g);
  if (!body_ok) {
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    return false;
  }
  if (!cuda_ok(ec, "end capture", &err)) return false;
  if (!cuda_ok(cudaGraphInstantiate(&ge, g, 0), "graph instantiate", &err)) {
    cudaGraphDestroy(g);
    return false;
  }
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) CK_SETUP(cudaEventCreate(&e));
  bool ok = true;
  for (int i = 0; i < warmup && ok; ++i) ok = cuda_ok(cudaGraphLaunch(ge, cx.stream), "graph launch", &err);
  ok = ok && sync_stream(cx.stream, "warm-up replays", &err);
  for (int i = 0; i < reps && ok; ++i) {
    ok = cuda_ok(cudaEventRecord(ev[2 * i], cx.stream), "event record", &err) &&
         cuda_ok(cudaGraphLaunch(ge, cx.stream), "graph launch", &err) &&
         cuda_ok(cudaEventRecord(ev[2 * i + 1], cx.stream), "event record", &err);
  }
  ok = ok && sync_stream(cx.stream, "timed replays", &err);
  std::vector<float> t;
  for (int i = 0; i < reps && ok; ++i) {
    float ms = 0;
    ok = cuda_ok(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "event elapsed", &err);
    t.push_back(ms);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  if (!ok) return false;
  std::sort(t.begin(), t.end());
  median_ms = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
  return true;
}

void time_variant(Ctx& cx, const Options& o, const Variant& v, int M) {
  MResult& r = g_results[v.name][M];
  std::unique_ptr<GemmPlan> plans[kCopies][4];
  for (int c = 0; c < kCopies; ++c)
    for (int l = 0; l < 4; ++l) {
      std::string err;
      plans[c][l] = make_plan(cx, v, l, c, M, err);
      if (!plans[c][l]) {
        r.error = std::string(kLinears[l].name) + ": " + err;
        return;
      }
    }
  std::string err;
  double ms = 0;
  auto layer = [&](cudaStream_t s, std::string& e) {
    for (int c = 0; c < kCopies; ++c)
      for (int l = 0; l < 4; ++l)
        if (!plans[c][l]->enqueue(s, e)) return false;
    return true;
  };
  if (time_graph(cx, layer, o.reps, o.warmup, ms, err)) r.layer_us = ms * 1000.0 / kCopies;
  else r.error = "layer graph: " + err;
  for (int l = 0; l < 4; ++l) {
    auto one = [&](cudaStream_t s, std::string& e) {
      for (int c = 0; c < kCopies; ++c)
        if (!plans[c][l]->enqueue(s, e)) return false;
      return true;
    };
    if (time_graph(cx, one, o.reps, o.warmup, ms, err)) r.linear_us[l] = ms * 1000.0 / kCopies;
    else if (r.error.empty()) r.error = std::string(kLinears[l].name) + " graph: " + err;
  }
}

// ------------------------------------------------------------------------------------------------ checks

void run_reference(Ctx& cx, Fmt f, int l, int M) {
  const Linear& L = kLinears[l];
  dim3 grid((L.N + 63) / 64, (M + 63) / 64), block(256);
  switch (f) {
    case Fmt::BF16:
      ref_gemm<Fmt::BF16><<<grid, block, 0, cx.stream>>>(cx.X, cx.w.bf16w[l][0], nullptr, 1.f, cx.Yref, M, L.N, L.K);
      break;
    case Fmt::FP8:
      ref_gemm<Fmt::FP8><<<grid, block, 0, cx.stream>>>(cx.X, cx.w.fp8_logical[l], nullptr, kFp8Alpha, cx.Yref, M, L.N, L.K);
      break;
    case Fmt::INT4:
      ref_gemm<Fmt::INT4><<<grid, block, 0, cx.stream>>>(cx.X, cx.w.int4_logical[l],
                                                         static_cast<const bf16*>(cx.w.scales[l][0]), 1.f, cx.Yref, M,
                                                         L.N, L.K);
      break;
  }
  CK_SETUP(cudaGetLastError());
  if (!sync_stream(cx.stream, "reference GEMM")) fatal_fault("reference GEMM failed");
}

void check_variant(Ctx& cx, const Variant& v, int l, int M) {
  CheckResult& cr = g_results[v.name][M].check[l];
  cr.done = true;
  const Linear& L = kLinears[l];
  std::string err;
  auto plan = make_plan(cx, v, l, 0, M, err);
  if (!plan) {
    cr.error = err;
    return;
  }
  const size_t n = size_t(M) * L.N;
  if (!cuda_ok(cudaMemsetAsync(cx.Y, 0xFF, n * sizeof(bf16), cx.stream), "poison", &cr.error)) return;
  if (!plan->enqueue(cx.stream, cr.error)) return;
  if (!sync_stream(cx.stream, "checked GEMM", &cr.error)) return;
  if (!cuda_ok(cudaMemsetAsync(cx.acc, 0, sizeof(CheckAcc), cx.stream), "memset", &cr.error)) return;
  compare<<<1024, 256, 0, cx.stream>>>(cx.Y, cx.Yref, n, cx.acc);
  if (!cuda_ok(cudaGetLastError(), "compare", &cr.error)) return;
  CheckAcc h{};
  if (!cuda_ok(cudaMemcpyAsync(&h, cx.acc, sizeof(h), cudaMemcpyDeviceToHost, cx.stream), "copy back", &cr.error)) return;
  if (!sync_stream(cx.stream, "compare", &cr.error)) return;
  float mx;
  memcpy(&mx, &h.max_err_bits, 4);
  cr.rel_l2 = h.ref2 > 0 ? std::sqrt(h.err2 / h.ref2) : NAN;
  cr.max_abs = mx;
  cr.nonfinite = h.nonfinite;
}

// ------------------------------------------------------------------------------------------------ json

std::string jnum(double x, int prec = 3) {
  if (!std::isfinite(x)) return "null";
  char b[64];
  snprintf(b, sizeof b, "%.*f", prec, x);
  return b;
}
std::string jnum_g(double x) {
  if (!std::isfinite(x)) return "null";
  char b[64];
  snprintf(b, sizeof b, "%.4g", x);
  return b;
}
std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return o + "\"";
}

struct Summary {
  double cublas_us = NAN, cublas_linear_sum_us = NAN;
  struct Best {
    std::string variant;
    double us = NAN, x_bf16 = NAN;
    double per_linear_us = NAN, per_linear_x_bf16 = NAN;
    std::string per_linear_variants[4];
  } fp8, int4;
};

Summary summarize(const std::vector<Variant>& vs, int M, bool check_enabled) {
  Summary s;
  auto it = g_results.find("cublas_bf16");
  if (it != g_results.end() && it->second.count(M)) {
    const MResult& c = it->second.at(M);
    s.cublas_us = c.layer_us;
    double sum = 0;
    for (double x : c.linear_us) sum += x;
    s.cublas_linear_sum_us = sum;
  }
  for (Fmt f : {Fmt::FP8, Fmt::INT4}) {
    Summary::Best& b = f == Fmt::FP8 ? s.fp8 : s.int4;
    double best_lin[4] = {NAN, NAN, NAN, NAN};
    for (const Variant& v : vs) {
      if (v.fmt != f) continue;
      auto vi = g_results.find(v.name);
      if (vi == g_results.end() || !vi->second.count(M)) continue;
      const MResult& r = vi->second.at(M);
      if (!r.checked_ok(check_enabled)) continue;
      if (std::isfinite(r.layer_us) && !(r.layer_us >= b.us)) b.us = r.layer_us, b.variant = v.name;
      for (int l = 0; l < 4; ++l)
        if (std::isfinite(r.linear_us[l]) && !(r.linear_us[l] >= best_lin[l]))
          best_lin[l] = r.linear_us[l], b.per_linear_variants[l] = v.name;
    }
    b.x_bf16 = s.cublas_us / b.us;
    b.per_linear_us = best_lin[0] + best_lin[1] + best_lin[2] + best_lin[3];
    b.per_linear_x_bf16 = s.cublas_linear_sum_us / b.per_linear_us;
  }
  return s;
}

struct DeviceInfo {
  std::string name;
  int sm_count = 0, cc_major = 0, cc_minor = 0, l2_bytes = 0, driver = 0, runtime = 0, cublas = 0;
};

void write_json(const Options& o, const DeviceInfo& d, const std::vector<Variant>& vs, bool complete) {
  std::ostringstream j;
  j << "{\n  \"benchmark\": \"sm90_mixed\",\n  \"complete\": " << (complete ? "true" : "false") << ",\n";
  j << "  \"device\": {\"name\": " << jstr(d.name) << ", \"cc\": \"" << d.cc_major << "." << d.cc_minor
    << "\", \"sm_count\": " << d.sm_count << ", \"l2_bytes\": " << d.l2_bytes << ", \"cuda_driver\": " << d.driver
    << ", \"cuda_runtime\": " << d.runtime << ", \"cublas\": " << d.cublas << "},\n";
  j << "  \"cutlass\": " << jstr(cutlass_version_string()) << ",\n";
  j << "  \"fp8_weight_reordered\": " << (weight_is_shuffled(WeightType::FP8) ? "true" : "false")
    << ", \"int4_weight_reordered\": " << (weight_is_shuffled(WeightType::INT4) ? "true" : "false") << ",\n";
  j << "  \"method\": " << jstr("CUDA graph of the 4 linears x 4 layer copies (4 copies of every weight), events "
                                "around each replay, median of " + std::to_string(o.reps) + " replays after " +
                                std::to_string(o.warmup) + " warm-up, / 4 = one layer; linear_us: a graph per linear "
                                "over its 4 copies. x_bf16 = cuBLAS bf16 time / this time (>1: faster than bf16).")
    << ",\n";
  j << "  \"check\": " << jstr(o.check ? "every variant, M and linear on copy 0, output poisoned with NaN, against a "
                                         "naive fp32 GEMM on the dequantized weight; ok: rel_l2 < 1e-2 and no "
                                         "non-finite output"
                                       : "disabled")
    << ",\n";
  j << "  \"linears\": [";
  for (int l = 0; l < 4; ++l)
    j << (l ? ", " : "") << "{\"name\": " << jstr(kLinears[l].name) << ", \"N\": " << kLinears[l].N
      << ", \"K\": " << kLinears[l].K << "}";
  j << "],\n  \"Ms\": [";
  for (size_t i = 0; i < o.ms.size(); ++i) j << (i ? ", " : "") << o.ms[i];
  j << "],\n  \"kernels\": [";
  bool first = true;
  for (const Variant& v : vs) {
    if (!v.kernel || v.decomp != Decomp::DataParallel) continue;
    j << (first ? "" : ", ") << "\n    {\"name\": " << jstr(v.kernel->name) << ", \"description\": "
      << jstr(v.kernel->description) << "}";
    first = false;
  }
  j << "],\n  \"skipped_after_fault\": [";
  for (size_t i = 0; i < g_faults_skipped.size(); ++i) j << (i ? ", " : "") << jstr(g_faults_skipped[i]);
  j << "],\n  \"variants\": {";
  first = true;
  for (const Variant& v : vs) {
    auto vi = g_results.find(v.name);
    if (vi == g_results.end()) continue;
    j << (first ? "" : ",") << "\n    " << jstr(v.name) << ": {\"weight\": " << jstr(fmt_name(v.fmt))
      << ", \"decomposition\": " << (v.kernel ? jstr(decomp_name(v.decomp)) : "null") << ", \"M\": {";
    first = false;
    bool f2 = true;
    for (const auto& [M, r] : vi->second) {
      j << (f2 ? "" : ",") << "\n      \"" << M << "\": {\"layer_us\": " << jnum(r.layer_us) << ", \"linear_us\": [";
      f2 = false;
      for (int l = 0; l < 4; ++l) j << (l ? ", " : "") << jnum(r.linear_us[l]);
      j << "], \"check_ok\": " << (r.checked_ok(o.check) ? "true" : "false") << ", \"rel_l2\": [";
      for (int l = 0; l < 4; ++l) j << (l ? ", " : "") << jnum_g(r.check[l].rel_l2);
      j << "], \"max_abs_err\": [";
      for (int l = 0; l < 4; ++l) j << (l ? ", " : "") << jnum_g(r.check[l].max_abs);
      j << "], \"nonfinite\": [";
      for (int l = 0; l < 4; ++l) j << (l ? ", " : "") << r.check[l].nonfinite;
      j << "], \"errors\": [";
      bool f3 = true;
      if (!r.error.empty()) j << jstr(r.error), f3 = false;
      for (int l = 0; l < 4; ++l)
        if (!r.check[l].error.empty())
          j << (f3 ? "" : ", ") << jstr(std::string(kLinears[l].name) + " check: " + r.check[l].error), f3 = false;
      j << "]}";
    }
    j << "}}";
  }
  j << "\n  },\n  \"summary\": [";
  for (size_t i = 0; i < o.ms.size(); ++i) {
    int M = o.ms[i];
    Summary s = summarize(vs, M, o.check);
    j << (i ? "," : "") << "\n    {\"M\": " << M << ", \"cublas_bf16_us\": " << jnum(s.cublas_us);
    for (Fmt f : {Fmt::FP8, Fmt::INT4}) {
      const Summary::Best& b = f == Fmt::FP8 ? s.fp8 : s.int4;
      j << ", \"" << fmt_name(f) << "\": {\"best_variant\": " << (b.variant.empty() ? "null" : jstr(b.variant))
        << ", \"us\": " << jnum(b.us) << ", \"x_bf16\": " << jnum(b.x_bf16) << ", \"per_linear_best_us\": "
        << jnum(b.per_linear_us) << ", \"per_linear_best_x_bf16\": " << jnum(b.per_linear_x_bf16)
        << ", \"per_linear_best_variants\": [";
      for (int l = 0; l < 4; ++l)
        j << (l ? ", " : "") << (b.per_linear_variants[l].empty() ? "null" : jstr(b.per_linear_variants[l]));
      j << "]}";
    }
    j << ", \"cublas_bf16_linear_sum_us\": " << jnum(s.cublas_linear_sum_us) << "}";
  }
  j << "\n  ]\n}\n";
  std::string tmp = o.json + ".tmp";
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f) {
    fprintf(stderr, "cannot write %s\n", tmp.c_str());
    return;
  }
  fputs(j.str().c_str(), f);
  fclose(f);
  rename(tmp.c_str(), o.json.c_str());
}

// ------------------------------------------------------------------------------------------------ main

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ','))
    if (!x.empty()) out.push_back(x);
  return out;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", a.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--reps") o.reps = std::max(1, atoi(next().c_str()));
    else if (a == "--warmup") o.warmup = std::max(0, atoi(next().c_str()));
    else if (a == "--ms") {
      o.ms.clear();
      for (auto& x : split(next())) o.ms.push_back(atoi(x.c_str()));
    } else if (a == "--skip") o.skip = split(next());
    else if (a == "--no-check") o.check = false;
    else if (a == "--json-selftest") o.json_selftest = true;
    else if (a[0] != '-' && o.json.empty()) o.json = a;
    else {
      fprintf(stderr, "unknown argument %s\n", a.c_str());
      return false;
    }
  }
  if (o.json.empty()) {
    fprintf(stderr, "usage: mixed_gemm OUT.json [--reps N] [--warmup N] [--ms a,b] [--skip k1,k2] [--no-check]\n");
    return false;
  }
  for (int M : o.ms)
    if (M <= 0 || M % 8 != 0) {
      fprintf(stderr, "M must be a positive multiple of 8 (TMA alignment): %d\n", M);
      return false;
    }
  return true;
}

void print_tables(const Options& o, const std::vector<Variant>& vs) {
  printf("\nOne Llama-3.1-8B decoder layer (qkv 6144x4096 + o 4096x4096 + gate_up 28672x4096 + down 4096x14336), us;\n"
         "x bf16 = cuBLAS bf16 us / CUTLASS us (>1: faster than bf16). Best = fastest variant that passed its check.\n");
  printf("%6s %12s | %10s %7s %-18s | %10s %7s %-18s\n", "M", "cuBLAS bf16", "fp8 us", "x bf16", "fp8 best",
         "int4 us", "x bf16", "int4 best");
  for (int M : o.ms) {
    Summary s = summarize(vs, M, o.check);
    printf("%6d %12.1f | %10.1f %7.2f %-18s | %10.1f %7.2f %-18s\n", M, s.cublas_us, s.fp8.us, s.fp8.x_bf16,
           s.fp8.variant.c_str(), s.int4.us, s.int4.x_bf16, s.int4.variant.c_str());
  }
  printf("\nPer linear, the fastest passing variant of each type for each linear (per-linear graphs), summed:\n");
  printf("%6s %12s | %10s %7s | %10s %7s\n", "M", "cuBLAS bf16", "fp8 us", "x bf16", "int4 us", "x bf16");
  for (int M : o.ms) {
    Summary s = summarize(vs, M, o.check);
    printf("%6d %12.1f | %10.1f %7.2f | %10.1f %7.2f\n", M, s.cublas_linear_sum_us, s.fp8.per_linear_us,
           s.fp8.per_linear_x_bf16, s.int4.per_linear_us, s.int4.per_linear_x_bf16);
  }
  printf("\nEvery variant, layer us (* = failed its check):\n%-20s", "variant");
  for (int M : o.ms) printf(" %9d", M);
  printf("\n");
  for (const Variant& v : vs) {
    printf("%-20s", v.name.c_str());
    for (int M : o.ms) {
      const MResult& r = g_results[v.name][M];
      printf(" %8.1f%s", r.layer_us, r.checked_ok(o.check) ? " " : "*");
    }
    printf("\n");
  }
  printf("\nPer linear us at each M (%s / %s / %s / %s):\n", kLinears[0].name, kLinears[1].name, kLinears[2].name,
         kLinears[3].name);
  for (const Variant& v : vs) {
    printf("%-20s", v.name.c_str());
    for (int M : o.ms) {
      const MResult& r = g_results[v.name][M];
      printf("  M=%d %.1f/%.1f/%.1f/%.1f", M, r.linear_us[0], r.linear_us[1], r.linear_us[2], r.linear_us[3]);
    }
    printf("\n");
  }
}

// Synthetic results through the tables and the JSON writer: checks them without a GPU.
int json_selftest(const Options& o, const std::vector<Variant>& vs) {
  DeviceInfo d;
  d.name = "selftest \"quoted\"";
  int i = 0;
  for (const Variant& v : vs)
    for (int M : o.ms) {
      MResult& r = g_results[v.name][M];
      ++i;
      r.layer_us = v.fmt == Fmt::BF16 ? 100.0 + M : (i % 7 == 0 ? NAN : 90.0 + M + i);
      for (int l = 0; l < 4; ++l) {
        r.linear_us[l] = r.layer_us / 4;
        r.check[l].done = o.check;
        r.check[l].rel_l2 = i % 5 == 0 ? 0.5 : 2e-3;
        r.check[l].max_abs = 0.01;
      }
      if (i % 7 == 0) r.error = "can_implement: \"Error\"\nsecond line";
      if (i % 11 == 0) r.check[2].nonfinite = 12;
    }
  print_tables(o, vs);
  write_json(o, d, vs, true);
  printf("\nwrote %s (synthetic)\n", o.json.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;
  g_json_path = o.json;
  remove((o.json + ".fault").c_str());
  setvbuf(stdout, nullptr, _IOLBF, 0);

  Ctx cx;
  DeviceInfo d;
  std::vector<Variant> vs;
  std::vector<const KernelEntry*> kernels = {&kernel_fp8_128x128(), &kernel_fp8_128x256(), &kernel_int4_128x128(),
                                             &kernel_int4_128x256()};
  auto skipped = [&](const std::string& g) { return std::find(o.skip.begin(), o.skip.end(), g) != o.skip.end(); };
  if (!skipped("cublas_bf16")) vs.push_back({"cublas_bf16", "cublas_bf16", Fmt::BF16, nullptr, Decomp::Heuristic});
  for (const KernelEntry* k : kernels) {
    if (skipped(k->name)) continue;
    for (Decomp dm : {Decomp::DataParallel, Decomp::Heuristic, Decomp::StreamK})
      vs.push_back({std::string(k->name) + "/" + decomp_name(dm), k->name,
                    k->weight == WeightType::FP8 ? Fmt::FP8 : Fmt::INT4, k, dm});
  }
  g_faults_skipped = o.skip;
  for (const KernelEntry* k : kernels) printf("kernel %-13s %s\n", k->name, k->description);
  printf("weights: e4m3 %s, int4 %s (reordered offline for the register-A wgmma fragment)\n",
         weight_is_shuffled(WeightType::FP8) ? "reordered" : "plain K-major",
         weight_is_shuffled(WeightType::INT4) ? "reordered [0,2,4,6,1,3,5,7]" : "plain K-major");
  if (o.json_selftest) return json_selftest(o, vs);
  CK_SETUP(cudaGetDevice(&cx.device));
  cudaDeviceProp prop{};
  CK_SETUP(cudaGetDeviceProperties(&prop, cx.device));
  d.name = prop.name, d.sm_count = prop.multiProcessorCount, d.cc_major = prop.major, d.cc_minor = prop.minor;
  d.l2_bytes = prop.l2CacheSize;
  cudaDriverGetVersion(&d.driver);
  cudaRuntimeGetVersion(&d.runtime);
  cx.sm_count = prop.multiProcessorCount;
  printf("device: %s (sm_%d%d, %d SMs, L2 %d MB), CUDA driver %d runtime %d, CUTLASS %s\n", prop.name, prop.major,
         prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20, d.driver, d.runtime, cutlass_version_string());
  if (prop.major != 9 || prop.minor != 0) {
    fprintf(stderr, "this program is built for sm_90a only (Hopper); found sm_%d%d\n", prop.major, prop.minor);
    return 1;
  }

  g_flush_json = [&]() { write_json(o, d, vs, false); };

  const int Mmax = *std::max_element(o.ms.begin(), o.ms.end());
  int Nmax = 0, Kmax = 0;
  for (const Linear& L : kLinears) Nmax = std::max(Nmax, L.N), Kmax = std::max(Kmax, L.K);
  CK_SETUP(cudaStreamCreateWithFlags(&cx.stream, cudaStreamNonBlocking));
  cx.X = static_cast<bf16*>(dev_alloc(size_t(Mmax) * Kmax * 2));
  cx.Y = static_cast<bf16*>(dev_alloc(size_t(Mmax) * Nmax * 2));
  cx.Yref = static_cast<float*>(dev_alloc(size_t(Mmax) * Nmax * 4));
  cx.acc = static_cast<CheckAcc*>(dev_alloc(sizeof(CheckAcc)));
  fill_bf16<<<1024, 256>>>(cx.X, size_t(Mmax) * Kmax, 7, -1.f, 1.f);
  CK_SETUP(cudaGetLastError());
  auto t0 = std::chrono::steady_clock::now();
  make_weights(cx.w);
  printf("weights ready (%d copies of each) in %.1f s\n", kCopies,
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  cublasStatus_t cs = cublasCreate(&cx.cublas);
  if (cs != CUBLAS_STATUS_SUCCESS) fatal_fault(std::string("cublasCreate: ") + cublasGetStatusString(cs));
  cublasGetVersion(cx.cublas, &d.cublas);
  const size_t cublas_ws_bytes = 32u << 20;
  cx.cublas_ws = dev_alloc(cublas_ws_bytes);
  if (cublasSetStream(cx.cublas, cx.stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(cx.cublas, cx.cublas_ws, cublas_ws_bytes) != CUBLAS_STATUS_SUCCESS)
    fatal_fault("cublasSetStream / cublasSetWorkspace");

  // Correctness: one reference per (M, linear, weight type), every variant of that type against it.
  if (o.check) {
    t0 = std::chrono::steady_clock::now();
    for (int M : o.ms)
      for (int l = 0; l < 4; ++l)
        for (Fmt f : {Fmt::BF16, Fmt::FP8, Fmt::INT4}) {
          bool any = false;
          for (const Variant& v : vs) any |= v.fmt == f;
          if (!any) continue;
          g_current_group = "reference";
          run_reference(cx, f, l, M);
          for (const Variant& v : vs) {
            if (v.fmt != f) continue;
            g_current_group = v.group;
            check_variant(cx, v, l, M);
          }
        }
    printf("\ncorrectness (rel L2 error per linear %s / %s / %s / %s; ok: < %.0e and no NaN/Inf):\n", kLinears[0].name,
           kLinears[1].name, kLinears[2].name, kLinears[3].name, kCheckRelL2);
    for (const Variant& v : vs)
      for (int M : o.ms) {
        const MResult& r = g_results[v.name][M];
        printf("  %-20s M=%-5d %s ", v.name.c_str(), M, r.checked_ok(true) ? "ok  " : "FAIL");
        for (int l = 0; l < 4; ++l) {
          const CheckResult& c = r.check[l];
          if (!c.error.empty()) printf(" [%s: %s]", kLinears[l].name, c.error.c_str());
          else printf(" %.2e%s", c.rel_l2, c.nonfinite ? (" (" + std::to_string(c.nonfinite) + " non-finite)").c_str() : "");
        }
        printf("\n");
      }
    printf("checks took %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    write_json(o, d, vs, false);
  }

  // Timing.
  t0 = std::chrono::steady_clock::now();
  for (const Variant& v : vs) {
    g_current_group = v.group;
    for (int M : o.ms) time_variant(cx, o, v, M);
    printf("timed %-20s", v.name.c_str());
    for (int M : o.ms) {
      const MResult& r = g_results[v.name][M];
      if (std::isfinite(r.layer_us)) printf("  M=%d %.1f us", M, r.layer_us);
      else printf("  M=%d [%s]", M, r.error.c_str());
    }
    printf("\n");
    write_json(o, d, vs, false);
  }
  printf("timing took %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  print_tables(o, vs);
  write_json(o, d, vs, true);
  printf("\nwrote %s\n", o.json.c_str());
  return 0;
}
