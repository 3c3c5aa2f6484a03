// bsmma::emulate (csrc/block_scaled_mma.cuh) on a CPU: a thread per lane of one simulated warp, shuffles through a
// barrier, the CUDA intrinsics it calls in their IEEE host forms. tests/kernels/test_block_scaled_emulation.py builds
// it (g++ -std=c++20, with an empty cuda_runtime.h first on the include path) and holds it to the NumPy model.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __constant__
struct Dim3 { unsigned x; };
thread_local Dim3 threadIdx;
static std::barrier<>* warp_barrier;
static uint32_t exchange[32];
template <class T>
T __shfl_sync(unsigned, T v, int src) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  exchange[threadIdx.x] = u;
  warp_barrier->arrive_and_wait();
  u = exchange[src & 31];
  warp_barrier->arrive_and_wait();
  T r;
  std::memcpy(&r, &u, 4);
  return r;
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __hiloint2double(int hi, int lo) {
  const uint64_t u = (uint64_t(uint32_t(hi)) << 32) | uint32_t(lo);
  double d; std::memcpy(&d, &u, 8); return d;
}
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline double __dmul_rn(double a, double b) { return a * b; }
#include "block_scaled_mma.cuh"

using namespace b12x::bsmma;

template <class I>
void run(int F, const uint32_t* a, const uint32_t* b, const float* c, const uint32_t* sfa, const uint32_t* sfb,
         const int32_t* sel, float* d) {
  std::barrier<> bar(32);
  warp_barrier = &bar;
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < 32; ++lane)
    lanes.emplace_back([=] {
      threadIdx.x = lane;
      for (int f = 0; f < F; ++f) {
        const size_t l = size_t(f) * 32 + lane;
        uint32_t ra[4], rb[2]; float rc[4], rd[4];
        for (int i = 0; i < 4; ++i) ra[i] = a[l * 4 + i], rc[i] = c[l * 4 + i];
        for (int i = 0; i < 2; ++i) rb[i] = b[l * 2 + i];
        const int32_t* s = sel + 4 * f;
        emulate<I>(rd, ra, rb, rc, sfa[l], sfb[l], s[0], s[1], s[2], s[3]);
        for (int i = 0; i < 4; ++i) d[l * 4 + i] = rd[i];
      }
    });
  for (auto& t : lanes) t.join();
}

int main(int argc, char** argv) {
  // argv: kind F in out; in: a u32[F,32,4] b u32[F,32,2] c f32[F,32,4] sfa u32[F,32] sfb u32[F,32] sel i32[F,4]
  const int kind = std::atoi(argv[1]), F = std::atoi(argv[2]);
  std::vector<uint32_t> a(F * 128), b(F * 64), sfa(F * 32), sfb(F * 32);
  std::vector<float> c(F * 128), d(F * 128);
  std::vector<int32_t> sel(F * 4);
  FILE* in = std::fopen(argv[3], "rb");
  size_t n = std::fread(a.data(), 4, a.size(), in) + std::fread(b.data(), 4, b.size(), in) +
             std::fread(c.data(), 4, c.size(), in) + std::fread(sfa.data(), 4, sfa.size(), in) +
             std::fread(sfb.data(), 4, sfb.size(), in) + std::fread(sel.data(), 4, sel.size(), in);
  std::fclose(in);
  if (n != size_t(F) * (128 + 64 + 128 + 32 + 32 + 4)) return 2;
  switch (kind) {
    case KIND_NVFP4: run<NVFP4>(F, a.data(), b.data(), c.data(), sfa.data(), sfb.data(), sel.data(), d.data()); break;
    case KIND_MXF4: run<MXF4>(F, a.data(), b.data(), c.data(), sfa.data(), sfb.data(), sel.data(), d.data()); break;
    case KIND_MXF8: run<MXF8>(F, a.data(), b.data(), c.data(), sfa.data(), sfb.data(), sel.data(), d.data()); break;
    default: run<MXF4_MXF8>(F, a.data(), b.data(), c.data(), sfa.data(), sfb.data(), sel.data(), d.data());
  }
  FILE* out = std::fopen(argv[4], "wb");
  std::fwrite(d.data(), 4, d.size(), out);
  std::fclose(out);
  return 0;
}
