// SM120 / SM121's block-scaled mma.sync, one device function for every instruction b12x issues, each taking exactly
// the instruction's registers; the instruction is a type of block_scaled_tables.h:
//
//   NVFP4     .kind::mxf4nvf4 m16n8k64, e2m1 x e2m1, ue4m3 scales, scale_vec::4X (a scale per 16 elements)
//   MXF4      .kind::mxf4nvf4 m16n8k64, e2m1 x e2m1, ue8m0 scales, scale_vec::2X (a scale per 32 elements)
//   MXF8      .kind::mxf8f6f4 m16n8k32, e4m3 x e4m3, ue8m0 scales, scale_vec::1X
//   MXF4_MXF8 .kind::mxf8f6f4 m16n8k32, e2m1 x e4m3, ue8m0 scales, scale_vec::1X
//
//   template <class I, int BYTE_ID_A, int THREAD_ID_A, int BYTE_ID_B, int THREAD_ID_B>
//   void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4], uint32_t sfa,
//            uint32_t sfb);
//
// d, a, b, c, sfa (scale-a-data) and sfb (scale-b-data) are the lane's registers of the PTX instruction; the
// selectors {byte-id, thread-id} are template parameters, as the PTX takes them as immediates (Table 40's values
// only: a static_assert says so). All 32 lanes of the warp call it together (it is .sync.aligned).
//
// On sm_120a / sm_121a (__CUDA_ARCH_FEAT_SM120_ALL / __CUDA_ARCH_FEAT_SM121_ALL) it issues the instruction. Everywhere
// else (the sm_90 build) it computes the result of b12x_kernels.block_scaled_mma's model bit for bit, with warp
// shuffles and scalar arithmetic:
//   1. each block's sum of products exactly: in fp32 where every partial sum of the block is a multiple of the
//      smallest product below 2^24 of it (e2m1 x e2m1), else in fp64 (the model checks <= 53 bits suffice);
//   2. times both scales in fp64 (exact), rounded once to fp32 (cvt.rn.f32.f64, subnormals kept);
//   3. added to C one block at a time, in K order, in fp32 (add.rn.f32, subnormals kept).
// Which lane and register hold what comes from csrc/block_scaled_tables.h, rendered from the model's tables (python
// -m b12x_kernels.block_scaled_mma --write); nothing here restates a layout. Inputs the PTX ISA leaves undefined
// (nonzero padding bits of an element container, the top bit of a ue4m3 scale byte) are masked off here.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "block_scaled_tables.h"
#include "static_for.cuh"

#if defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL)
#define B12X_BSMMA_NATIVE 1
#endif

namespace b12x {
namespace bsmma {

// Table 40: byte-id among the instruction's (scale_vec::1X: 0-3, 2X: 0 or 2, 4X: 0), thread-id-a 0-1, thread-id-b
// 0-3.
template <class I>
constexpr bool valid_selectors(int byte_id_a, int thread_id_a, int byte_id_b, int thread_id_b) {
  return byte_id_a >= 0 && byte_id_a < 4 && ((I::byte_ids >> byte_id_a) & 1) && byte_id_b >= 0 && byte_id_b < 4 &&
         ((I::byte_ids >> byte_id_b) & 1) && thread_id_a >= 0 && thread_id_a < 2 && thread_id_b >= 0 &&
         thread_id_b < 4;
}

namespace detail {

// (The host forms let the emulation run in a simulated warp on a CPU.)
__device__ __forceinline__ int lane_id() {
#ifdef __CUDA_ARCH__
  int lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
#else
  return int(threadIdx.x) & 31;
#endif
}

// Round to nearest even with subnormals kept, whatever -ftz / --use_fast_math say.
__device__ __forceinline__ float add_rn(float x, float y) {
#ifdef __CUDA_ARCH__
  float z;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(z) : "f"(x), "f"(y));
  return z;
#else
  return x + y;
#endif
}

__device__ __forceinline__ float to_f32_rn(double x) {
#ifdef __CUDA_ARCH__
  float z;
  asm("cvt.rn.f32.f64 %0, %1;" : "=f"(z) : "d"(x));
  return z;
#else
  return float(x);
#endif
}

template <class R>
__device__ __forceinline__ R pow2(int e) {
  if constexpr (std::is_same_v<R, float>) {
    return __int_as_float((127 + e) << 23);  // a normal fp32 exponent: the caller's static_assert
  } else {
    return __hiloint2double((1023 + e) << 20, 0);
  }
}

// A code of element or scale type T (block_scaled_tables.h: the model's ElementType) as R, exactly.
template <class T, class R>
__device__ __forceinline__ R decode(uint32_t code) {
  constexpr int lo = (T::no_subnormals ? 0 : 1) - T::bias - T::man_bits;
  constexpr int hi = (1 << T::exp_bits) - 1 - T::bias;
  static_assert(std::is_same_v<R, double> ? (lo >= -1022 && hi <= 1023) : (lo >= -126 && hi <= 127),
                "a power of two of this type is no normal number of R");
  constexpr uint32_t mag_mask = (1u << (T::exp_bits + T::man_bits)) - 1;
  const uint32_t mag = code & mag_mask;
  const int exp = int(mag >> T::man_bits);
  const uint32_t man = mag & ((1u << T::man_bits) - 1);
  R v;
  if constexpr (T::no_subnormals) {
    v = pow2<R>(exp - T::bias);
  } else {
    const uint32_t sig = exp ? (man | (1u << T::man_bits)) : man;
    v = R(sig) * pow2<R>((exp ? exp : 1) - T::bias - T::man_bits);
  }
  if constexpr (T::ieee_specials) {
    if (exp == (1 << T::exp_bits) - 1) v = man ? R(NAN) : R(INFINITY);
  }
  if constexpr (T::nan >= 0) {
    if (mag == uint32_t(T::nan)) v = R(NAN);
  }
  if constexpr (T::is_signed) {
    if ((code >> (T::exp_bits + T::man_bits)) & 1) v = -v;
  }
  return v;
}

template <class R>
__device__ __forceinline__ R fma_rn(R x, R y, R z) {
  if constexpr (std::is_same_v<R, float>) {
    return __fmaf_rn(x, y, z);
  } else {
    return __fma_rn(x, y, z);
  }
}

}  // namespace detail

// The model's result (b12x_kernels.block_scaled_mma.mma) for this lane's D registers, on any architecture, the
// selectors as values (Table 40's, unchecked): what mma<I, ...> computes off SM12x, where it passes its template
// parameters here (and they fold).
template <class I>
__device__ __forceinline__ void emulate(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                        const float (&c)[4], uint32_t sfa, uint32_t sfb, int byte_id_a,
                                        int thread_id_a, int byte_id_b, int thread_id_b) {
  using namespace detail;
  using F = typename I::frag;
  using Acc = std::conditional_t<I::fp32_block_sum, float, double>;
  static_assert(I::a_per_reg == I::b_per_reg, "A and B words must cover the same K");
  static_assert(I::block % I::a_per_reg == 0, "a word must lie in one scale block");
  constexpr unsigned FULL = 0xffffffffu;
  constexpr int R = C_ROW_SLOTS, S = C_COL_SLOTS, NB = I::scale_vec, WORDS = I::k / I::a_per_reg;
  const int lane = lane_id();

  // scale_A of the lane's rows and scale_B of its columns, block by block
  double sa[R][NB], sb[S][NB];
  static_for<R>([&](auto r) {
    const uint32_t word = __shfl_sync(FULL, sfa, SFA_LANE[thread_id_a][r][lane]) >> (8 * byte_id_a);
    static_for<NB>([&](auto j) { sa[r][j] = decode<typename I::stype, double>((word >> (8 * j)) & 0xffu); });
  });
  static_for<S>([&](auto s) {
    const uint32_t word = __shfl_sync(FULL, sfb, SFB_LANE[thread_id_b][s][lane]) >> (8 * byte_id_b);
    static_for<NB>([&](auto j) { sb[s][j] = decode<typename I::stype, double>((word >> (8 * j)) & 0xffu); });
  });

  // 1. each block's sum of products for each of the lane's four D elements (exact: see the header)
  int a_lane[R], b_lane[S];
  static_for<R>([&](auto r) { a_lane[r] = F::a_base(r, lane); });
  static_for<S>([&](auto s) { b_lane[s] = F::b_base(s, lane); });
  Acc sum[4][NB];
  static_for<4>([&](auto i) { static_for<NB>([&](auto j) { sum[i][j] = Acc(0); }); });
  static_for<WORDS>([&](auto w) {
    constexpr int j = w * I::a_per_reg / I::block;
    uint32_t wa[R], wb[S];
    static_for<R>([&](auto r) {
      constexpr int reg = F::A_REG[r][w], step = F::A_STEP[w];
      wa[r] = __shfl_sync(FULL, a[reg], a_lane[r] + step);
    });
    static_for<S>([&](auto s) {
      constexpr int reg = F::B_REG[s][w], step = F::B_STEP[w];
      wb[s] = __shfl_sync(FULL, b[reg], b_lane[s] + step);
    });
    static_for<I::a_per_reg>([&](auto e) {
      constexpr uint32_t a_mask = (1u << I::atype::bits) - 1, b_mask = (1u << I::btype::bits) - 1;
      Acc xa[R], xb[S];
      static_for<R>([&](auto r) {
        xa[r] = decode<typename I::atype, Acc>((wa[r] >> (e * I::a_width + I::a_shift)) & a_mask);
      });
      static_for<S>([&](auto s) {
        xb[s] = decode<typename I::btype, Acc>((wb[s] >> (e * I::b_width + I::b_shift)) & b_mask);
      });
      static_for<4>([&](auto i) {
        constexpr int r = C_ROW_SLOT[i], s = C_COL_SLOT[i];
        sum[i][j] = fma_rn<Acc>(xa[r], xb[s], sum[i][j]);
      });
    });
  });

  // 2. scaled and rounded once to fp32; 3. added to C in K order
  static_for<4>([&](auto i) {
    constexpr int r = C_ROW_SLOT[i], s = C_COL_SLOT[i];
    float v = c[i];
    static_for<NB>([&](auto j) {
      const double t = __dmul_rn(__dmul_rn(double(sum[i][j]), sa[r][j]), sb[s][j]);
      v = add_rn(v, to_f32_rn(t));
    });
    d[i] = v;
  });
}

#define B12X_BSMMA_ASM(ptx)                                                                                \
  asm volatile(ptx " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13}, %14, {%15, %16}, " \
                   "%17, {%18, %19};\n"                                                                   \
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                           \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),  \
                 "f"(c[2]), "f"(c[3]), "r"(sfa), "n"(BA), "n"(TA), "r"(sfb), "n"(BB), "n"(TB))

// D = (A · scale_A)(B · scale_B) + C for instruction I (block_scaled_tables.h: NVFP4, MXF4, MXF8, MXF4_MXF8). d may
// be c.
template <class I, int BA, int TA, int BB, int TB>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                    const float (&c)[4], uint32_t sfa, uint32_t sfb) {
  static_assert(valid_selectors<I>(BA, TA, BB, TB), "byte-id / thread-id outside Table 40 for this instruction");
#ifdef B12X_BSMMA_NATIVE
  if constexpr (I::kind == KIND_NVFP4) {
    B12X_BSMMA_ASM(B12X_BSMMA_PTX_NVFP4);
  } else if constexpr (I::kind == KIND_MXF4) {
    B12X_BSMMA_ASM(B12X_BSMMA_PTX_MXF4);
  } else if constexpr (I::kind == KIND_MXF8) {
    B12X_BSMMA_ASM(B12X_BSMMA_PTX_MXF8);
  } else {
    static_assert(I::kind == KIND_MXF4_MXF8, "an instruction without its PTX here");
    B12X_BSMMA_ASM(B12X_BSMMA_PTX_MXF4_MXF8);
  }
#else
  emulate<I>(d, a, b, c, sfa, sfb, BA, TA, BB, TB);
#endif
}

#undef B12X_BSMMA_ASM

}  // namespace bsmma
}  // namespace b12x
