// One CUTLASS SM90 mixed-input GEMM per weight kind (sm90_mixed_e4m3.cu, _nvfp4.cu, _mxfp4.cu, _mxfp8.cu, _q8_0.cu
// include this once).
//
// The pipeline is CUTLASS's own: TMA loads of the weight codes, their block scales and the activations, a producer
// warp and two cooperative consumer warpgroups on CUTLASS's pipeline classes, the persistent stream-K tile
// scheduler, wgmma with the weight as the register operand, and the TMA epilogue (per-row factor, per-row bias, bf16
// out). The operands are swapped (A = W, B = X, the problem N x M x K), so the narrow weight is the converted register
// operand and D = Y^T column-major is Y row-major.
//
// What b12x adds is the conversion of its formats:
//  - E4M3: CUTLASS's e4m3 -> bf16 conversion (exact); the per-tensor factor is the epilogue's per-row alpha.
//  - E2M1 with block scales (NVFP4: e4m3 per 16 k, MXFP4: e8m0 per 32 k): CUTLASS's SM90 mixed-input collective
//    takes one scale per row and k-tile (its group size must be a multiple of the 64-deep k-tile). Here the "scale"
//    it moves is a TileScales carrier, the 4 (or 2) block scales of one row over one k-tile, so TMA, shared memory
//    and the register copy stay CUTLASS's. The collective's per-k-block dequantization (MixedInputUtils::
//    dequantize_A_kblock, which knows the 16-deep k-block) is specialized for those carriers: it picks the k-block's
//    scale byte, decodes it to bf16 and multiplies the converted codes by it. e2m1 (2 significant bits) times an
//    e4m3 or e8m0 scale (at most 4) is exact in bf16, so the weight the wgmma sees is the format's value exactly.
//  - MXFP8 (e4m3 with an e8m0 scale per 32 k): the same carrier and dequantization as MXFP4. e4m3 (4 significant
//    bits) times a power of two is exact in bf16 (8 significant bits, fp32's exponent range) unless the product
//    leaves that range: past bf16's largest finite value (scale bytes near 255 times large codes) or with bits below
//    its smallest subnormal, 2^-133 (scales near 2^-127), which no quantizer's scales reach. The mma family
//    multiplies the same bf16 values.
//  - Q8_0 (GGML: int8 q, an fp16 d per 32 k): the int8 codes are the collective's A and a Q8Deltas carrier (the
//    row's two d's over one k-tile) its "scale". Its dequantization computes q * d in fp32 (exact: 8 x 11
//    significant bits) and rounds once to bf16, as the mma family's FmtQ8_0 does, so both see the same weight.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"  // also CUTLASS's MixedInputUtils, specialized below
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "cutlass/util/packed_stride.hpp"
#include "sm90_mixed.h"
#include "sm90_mixed_layout.cuh"

namespace b12x::sm90 {

// The block scales of one weight row over one k-tile (kTileK deep), byte i covering k [i * kGroup, (i + 1) * kGroup)
// of the tile. What TMA moves and the register copy carries in place of CUTLASS's per-group scale.
template <int kGroup, bool kE8M0>
struct alignas(kTileK / kGroup) TileScales {
  static constexpr int kGroupSize = kGroup;
  static constexpr bool kPowerOfTwo = kE8M0;
  uint8_t bytes[kTileK / kGroup];
};
using NvFp4Scales = TileScales<16, false>;  // e4m3, 16 k each
using MxFp4Scales = TileScales<32, true>;   // e8m0, 32 k each
using MxFp8Scales = MxFp4Scales;            // MXFP8's scales are MXFP4's

template <class T>
struct is_tile_scales : cute::false_type {};
template <int G, bool E>
struct is_tile_scales<TileScales<G, E>> : cute::true_type {};

// Q8_0's d's of one weight row over one k-tile: halves[i] (fp16 bits) scales k [32 i, 32 i + 32) of the tile. Four
// bytes, so TMA moves it as NvFp4Scales' size.
struct alignas(4) Q8Deltas {
  static constexpr int kGroupSize = 32;
  uint16_t halves[kTileK / kGroupSize];
};

// One block-scale byte as bf16, exactly: e4m3 through the hardware fp8 -> f16 conversion (every e4m3 value is an f16
// and a bf16 value); e8m0 2^(e - 127) straight into bf16's exponent (e = 0: 2^-127, bf16's subnormal 0x0040;
// e = 255: NaN).
template <bool kE8M0>
__device__ __forceinline__ __nv_bfloat16 scale_to_bf16(uint8_t byte) {
  if constexpr (kE8M0) {
    const uint16_t bits = byte == 0 ? uint16_t(0x0040) : byte == 255 ? uint16_t(0x7fc0) : uint16_t(byte << 7);
    return __nv_bfloat16_raw{bits};
  } else {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(byte, __NV_E4M3);
    return __float2bfloat16_rn(__half2float(__half(h)));
  }
}

// Two e2m1 codes, in the low nibbles of a register's two halves, as a bf16x2 holding their values exactly. A code
// s|e1 e0|m placed as bf16 bits s << 15 | (e1 e0 m) << 6 is the e2m1 value times 2^-126 (exponent field e1 e0,
// mantissa m; e = 0 gives bf16's subnormals m * 2^-127, which bf16 multiplies keep), so one multiply by 2^126 makes
// it exact.
__device__ __forceinline__ uint32_t e2m1_pair_to_bf16x2(uint32_t pair) {
  uint32_t bits = ((pair & 0x00070007u) << 6) | ((pair & 0x00080008u) << 12);
  __nv_bfloat162& v = reinterpret_cast<__nv_bfloat162&>(bits);
  v = __hmul2(v, __nv_bfloat162(__nv_bfloat162_raw{0x7e80, 0x7e80}));
  return bits;
}

}  // namespace b12x::sm90

namespace cutlass {

// e2m1 -> bf16 for 8 codes of one 32-bit register in the [0,2,4,6,1,3,5,7] order the reorder gives 4-bit codes (the
// order of CUTLASS's int4 -> bf16 converter): shifting the register by 4i puts codes 2i and 2i + 1 in the low nibbles
// of the two halves.
template <>
struct LayoutAwareConvertImpl<cutlass::float_e2m1_t, cutlass::bfloat16_t,
                              cute::Layout<cute::Shape<cute::_2, cute::_4>, cute::Stride<cute::_4, cute::_1>>,
                              cute::Layout<cute::_8>> {
  template <class EngineIn, class EngineOut>
  CUTLASS_DEVICE static void convert(
      cute::Tensor<EngineIn, cute::Layout<cute::Shape<cute::_2, cute::_4>, cute::Stride<cute::_4, cute::_1>>> const& src,
      cute::Tensor<EngineOut, cute::Layout<cute::_8>>& dst) {
    static_assert(cute::is_same_v<cutlass::float_e2m1_t, typename EngineIn::value_type> &&
                  cute::is_same_v<cutlass::bfloat16_t, typename EngineOut::value_type>);
    using DstArray = cutlass::Array<cutlass::bfloat16_t, 8>;
    using RegArray = cutlass::AlignedArray<uint32_t, 4, sizeof(DstArray)>;
    const uint32_t codes = cute::recast<uint32_t>(src)(0);
    auto&& r = cute::recast<RegArray>(dst)(0);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 4; ++i) r[i] = b12x::sm90::e2m1_pair_to_bf16x2(codes >> (4 * i));
  }
};

// e2m1 -> bf16 for 8 codes in natural order (the checkpoint's: code j in nibble j): byte i holds codes 2i and 2i + 1,
// spread to the two halves of a register.
template <>
struct LayoutAwareConvertImpl<cutlass::float_e2m1_t, cutlass::bfloat16_t, cute::Layout<cute::_8>, cute::Layout<cute::_8>> {
  template <class EngineIn, class EngineOut>
  CUTLASS_DEVICE static void convert(cute::Tensor<EngineIn, cute::Layout<cute::_8>> const& src,
                                     cute::Tensor<EngineOut, cute::Layout<cute::_8>>& dst) {
    using DstArray = cutlass::Array<cutlass::bfloat16_t, 8>;
    using RegArray = cutlass::AlignedArray<uint32_t, 4, sizeof(DstArray)>;
    const uint32_t codes = cute::recast<uint32_t>(src)(0);
    auto&& r = cute::recast<RegArray>(dst)(0);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t byte = codes >> (8 * i);
      r[i] = b12x::sm90::e2m1_pair_to_bf16x2((byte & 0xfu) | ((byte & 0xf0u) << 12));
    }
  }
};

}  // namespace cutlass

namespace cutlass::gemm::collective::detail {

// CUTLASS's per-collective helpers, reading the collective's types through this view so the block-scaled
// specialization below can reuse them (the primary template reads only these names).
template <class C>
struct MixedInputUtilsView {
  using KernelSchedule = typename C::KernelSchedule;
  using SmemLayoutA = typename C::SmemLayoutA;
  using SmemLayoutB = typename C::SmemLayoutB;
  using SmemLayoutScale = typename C::SmemLayoutScale;
  using SwappedElementA = typename C::SwappedElementA;
  using SwappedElementB = typename C::SwappedElementB;
  using RealSwappedElementA = typename C::RealSwappedElementA;
  using RealSwappedElementB = typename C::RealSwappedElementB;
  using ElementScale = typename C::ElementScale;
  using ElementZero = typename C::ElementZero;
  using SmemCopyAtomScale = typename C::SmemCopyAtomScale;
  static constexpr auto KernelConversionMode = C::KernelConversionMode;
  static constexpr auto ModeHasScales = C::ModeHasScales;
  static constexpr auto UseScaleLookupTable = C::UseScaleLookupTable;
};

// The SM90 mixed-input collective with b12x block scales (ElementA = (codes, TileScales)): CUTLASS's helpers, except
// the per-k-block dequantization, which selects the k-block's scale from the tile's carrier.
template <class Policy, class TileShape, class Codes, int kGroup, bool kE8M0, class StrideA, class ElementB,
          class StrideB, class TiledMma, class GmemCopyA, class SmemAtomA, class SmemCopyA, class TransformA,
          class GmemCopyB, class SmemAtomB, class SmemCopyB, class TransformB>
struct MixedInputUtils<CollectiveMma<Policy, TileShape, cute::tuple<Codes, b12x::sm90::TileScales<kGroup, kE8M0>>,
                                     StrideA, ElementB, StrideB, TiledMma, GmemCopyA, SmemAtomA, SmemCopyA, TransformA,
                                     GmemCopyB, SmemAtomB, SmemCopyB, TransformB>>
    : MixedInputUtils<MixedInputUtilsView<
          CollectiveMma<Policy, TileShape, cute::tuple<Codes, b12x::sm90::TileScales<kGroup, kE8M0>>, StrideA, ElementB,
                        StrideB, TiledMma, GmemCopyA, SmemAtomA, SmemCopyA, TransformA, GmemCopyB, SmemAtomB,
                        SmemCopyB, TransformB>>> {
  // wgmma's k-block for 16-bit operands
  static constexpr int kBlockK = 16;
  static_assert(kGroup % kBlockK == 0, "a k-block must lie inside one scale group");

  template <class EngineIn, class EngineOut, class LayoutIn, class LayoutOut, class... Ts>
  CUTLASS_DEVICE static void dequantize_A_kblock(cute::Tensor<EngineIn, LayoutIn> const& tCrA_load,
                                                 cute::Tensor<EngineOut, LayoutOut>& tCrA_mma,
                                                 cute::tuple<Ts...>& partitioned_extra_info, int const k_block) {
    using namespace cute;
    using SrcType = typename EngineIn::value_type;
    static_assert(is_same_v<typename EngineOut::value_type, cutlass::bfloat16_t>, "the wgmma operand is bf16");

    Tensor src = tCrA_load(_, _, k_block);
    Tensor dst = tCrA_mma(_, _, k_block);
    // The carriers, laid out as the A fragment (the same carrier for every k of a row: stride 0 along k).
    Tensor carriers = cute::get<1>(partitioned_extra_info)(_, _, k_block);
    CUTE_STATIC_ASSERT_V(size(src) == size(carriers));
    const int pick = k_block * kBlockK / kGroup;  // k_block counts 16-deep blocks inside the k-tile
    Tensor scales = make_tensor<cutlass::bfloat16_t>(carriers.layout());
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(carriers); ++i) {
      const __nv_bfloat16 s = b12x::sm90::scale_to_bf16<kE8M0>(carriers(i).bytes[pick]);
      scales(i) = reinterpret_cast<cutlass::bfloat16_t const&>(s);
    }

    // As CUTLASS's ConvertAndScale: convert a register's worth of codes, then scale them value by value.
    constexpr int kPerReg = cute::min(decltype(size(src(_, 0)))::value, ceil_div(32, sizeof_bits_v<SrcType>));
    Tensor src_vm = cute::group_modes<1, -1>(cute::zipped_divide(src, Int<kPerReg>{}));
    Tensor dst_vm = cute::group_modes<1, -1>(cute::zipped_divide(dst, Int<kPerReg>{}));
    Tensor scales_vm = cute::group_modes<1, -1>(cute::zipped_divide(scales, Int<kPerReg>{}));
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<1>(dst_vm); ++i) {
      LayoutAwareConvert(src_vm(_, i), dst_vm(_, i));
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<0>(dst_vm); ++j) {
        __nv_bfloat16& v = reinterpret_cast<__nv_bfloat16&>(dst_vm(j, i));
        v = __hmul(v, reinterpret_cast<__nv_bfloat16 const&>(scales_vm(j, i)));
      }
    }
  }
};

// The SM90 mixed-input collective with Q8_0 weights (ElementA = (int8 codes, Q8Deltas)): CUTLASS's helpers, except
// the per-k-block dequantization, which computes each weight as q * d in fp32 and rounds it once to bf16.
template <class Policy, class TileShape, class StrideA, class ElementB, class StrideB, class TiledMma, class GmemCopyA,
          class SmemAtomA, class SmemCopyA, class TransformA, class GmemCopyB, class SmemAtomB, class SmemCopyB,
          class TransformB>
struct MixedInputUtils<CollectiveMma<Policy, TileShape, cute::tuple<int8_t, b12x::sm90::Q8Deltas>, StrideA, ElementB,
                                     StrideB, TiledMma, GmemCopyA, SmemAtomA, SmemCopyA, TransformA, GmemCopyB,
                                     SmemAtomB, SmemCopyB, TransformB>>
    : MixedInputUtils<MixedInputUtilsView<
          CollectiveMma<Policy, TileShape, cute::tuple<int8_t, b12x::sm90::Q8Deltas>, StrideA, ElementB, StrideB,
                        TiledMma, GmemCopyA, SmemAtomA, SmemCopyA, TransformA, GmemCopyB, SmemAtomB, SmemCopyB,
                        TransformB>>> {
  static constexpr int kBlockK = 16;  // wgmma's k-block for 16-bit operands
  static_assert(b12x::sm90::Q8Deltas::kGroupSize % kBlockK == 0, "a k-block must lie inside one d's group");

  template <class EngineIn, class EngineOut, class LayoutIn, class LayoutOut, class... Ts>
  CUTLASS_DEVICE static void dequantize_A_kblock(cute::Tensor<EngineIn, LayoutIn> const& tCrA_load,
                                                 cute::Tensor<EngineOut, LayoutOut>& tCrA_mma,
                                                 cute::tuple<Ts...>& partitioned_extra_info, int const k_block) {
    using namespace cute;
    static_assert(is_same_v<typename EngineIn::value_type, int8_t>, "Q8_0 codes are int8");
    static_assert(is_same_v<typename EngineOut::value_type, cutlass::bfloat16_t>, "the wgmma operand is bf16");

    Tensor src = tCrA_load(_, _, k_block);
    Tensor dst = tCrA_mma(_, _, k_block);
    // The carriers, laid out as the A fragment (the same carrier for every k of a row: stride 0 along k).
    Tensor carriers = cute::get<1>(partitioned_extra_info)(_, _, k_block);
    CUTE_STATIC_ASSERT_V(size(src) == size(carriers));
    const int pick = k_block * kBlockK / b12x::sm90::Q8Deltas::kGroupSize;
    Tensor d = make_tensor<float>(carriers.layout());
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(carriers); ++i) d(i) = __half2float(__ushort_as_half(carriers(i).halves[pick]));

    // Four codes a register (the reorder keeps 8-bit codes in natural order, so they are one 32-bit word).
    Tensor src_vm = cute::group_modes<1, -1>(cute::zipped_divide(src, Int<4>{}));
    Tensor dst_vm = cute::group_modes<1, -1>(cute::zipped_divide(dst, Int<4>{}));
    Tensor d_vm = cute::group_modes<1, -1>(cute::zipped_divide(d, Int<4>{}));
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<1>(src_vm); ++i) {
      Tensor codes = coalesce(src_vm(_, i));
      static_assert(is_same_v<decltype(codes.layout()), Layout<_4, _1>>, "four codes must be one register");
      // offset-binary (byte = q + 128): 2^23 + byte as a float is exact, so subtracting 2^23 + 128 leaves q exactly
      const uint32_t word = recast<uint32_t>(codes)(0) ^ 0x80808080u;
      float w[4];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) {
        w[j] = (__uint_as_float(__byte_perm(word, 0x4B000000u, 0x7440u | j)) - 8388736.0f) * d_vm(j, i);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; j += 2) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(w[j], w[j + 1]);  // one rounding of the exact product
        dst_vm(j, i) = reinterpret_cast<cutlass::bfloat16_t const&>(pair.x);
        dst_vm(j + 1, i) = reinterpret_cast<cutlass::bfloat16_t const&>(pair.y);
      }
    }
  }
};

}  // namespace cutlass::gemm::collective::detail

namespace b12x::sm90 {

// The epilogue every kind shares: D = alpha[n] * acc + bias[n] (per weight row, a row of the swapped problem), bf16
// out through TMA. One per token tile, each built outside any template: gcc, as nvcc's host compiler, rejects CUTLASS's
// epilogue builder when it is instantiated in a dependent context.
template <int kTokens>
using MixedTile = cute::Shape<cute::_128, cute::Int<kTokens>, cute::Int<kTileK>>;
using MixedCluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
using MixedFusion = cutlass::epilogue::fusion::PerRowLinCombPerRowBiasEltAct<
    cutlass::epilogue::thread::Identity, cutlass::bfloat16_t, float, cutlass::bfloat16_t, cutlass::bfloat16_t, float>;
template <int kTokens>
struct MixedEpilogueOf;
#define B12X_SM90_MIXED_EPILOGUE(T)                                                                                   \
  template <>                                                                                                        \
  struct MixedEpilogueOf<T> {                                                                                        \
    using type = cutlass::epilogue::collective::CollectiveBuilder<                                                   \
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, MixedTile<T>, MixedCluster,                             \
        cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::ColumnMajor, 8,        \
        cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 8, cutlass::epilogue::TmaWarpSpecializedCooperative,      \
        MixedFusion>::CollectiveOp;                                                                                  \
  };
B12X_SM90_MIXED_EPILOGUE(16)
B12X_SM90_MIXED_EPILOGUE(64)
B12X_SM90_MIXED_EPILOGUE(128)
B12X_SM90_MIXED_EPILOGUE(256)
#undef B12X_SM90_MIXED_EPILOGUE

// One kernel: the weight's codes (cutlass::float_e4m3_t, float_e2m1_t or int8_t), block-scale carrier (TileScales,
// Q8Deltas; void: none), layout (sm90_mixed_layout.cuh) and the tile's tokens (the problem's N: 128 weight rows x
// kTokens tokens x 64 k).
template <class Codes, class Scales, bool kReordered, int kTokens>
struct MixedGemm {
  using ElementX = cutlass::bfloat16_t;
  using ElementY = cutlass::bfloat16_t;
  using ElementAcc = float;
  static constexpr bool kScaled = !cute::is_void_v<Scales>;

  using TileShape = MixedTile<kTokens>;
  using ClusterShape = MixedCluster;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;

  static constexpr int kAlignW = 128 / cutlass::sizeof_bits<Codes>::value;
  static constexpr int kAlign16 = 8;
  // B = X (M x K, K-major: "column-major B"), D = Y^T (N x M column-major).
  using LayoutX = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::ColumnMajor;
  using WLayout = WeightLayout<Codes, kReordered>;

  using EpilogueOp = typename MixedEpilogueOf<kTokens>::type;
  // What the mainloop's stages leave for the epilogue
  static constexpr int kEpilogueSmem = static_cast<int>(sizeof(typename EpilogueOp::SharedStorage));

  using MainloopW = cute::conditional_t<kScaled, cute::tuple<Codes, Scales>, Codes>;
  using MainloopOp = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, MainloopW, typename WLayout::Builder, kAlignW, ElementX,
      LayoutX, kAlign16, ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueSmem>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, MainloopOp,
                                                      EpilogueOp, cutlass::gemm::StreamKScheduler>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Arguments = typename Kernel::Arguments;

  static Arguments arguments(const MixedGemmArgs& a) {
    using namespace cute;
    using Decomp = cutlass::gemm::kernel::detail::DecompositionMode;
    Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {a.n, a.m, a.k, 1};
    args.mainloop.ptr_A = static_cast<Codes const*>(a.w);
    args.mainloop.dA = WLayout::of(a.n, a.k);
    args.mainloop.ptr_B = static_cast<ElementX const*>(a.x);
    args.mainloop.dB = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(a.m, a.k, 1));
    if constexpr (kScaled) {
      using StrideS = typename MainloopOp::StrideScale;
      args.mainloop.ptr_S = static_cast<Scales const*>(a.scales);
      args.mainloop.dS = cutlass::make_cute_packed_stride(StrideS{}, make_shape(a.n, a.k / kTileK, 1));
      args.mainloop.group_size = kTileK;  // one carrier per k-tile
    }
    auto& fusion = args.epilogue.thread;
    fusion.alpha_ptr = a.alpha;
    fusion.dAlpha = {true, _0{}, 0};
    fusion.beta = 0.f;
    fusion.bias_ptr = static_cast<ElementY const*>(a.bias);
    const auto dD = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(a.n, a.m, 1));
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = dD;
    args.epilogue.ptr_D = static_cast<ElementY*>(a.y);
    args.epilogue.dD = dD;
    int device = 0;
    cudaGetDevice(&device);
    args.hw_info.device_id = device;
    args.hw_info.sm_count = a.sms;
    args.scheduler.decomposition_mode = a.decomposition == int(Decomposition::DataParallel) ? Decomp::DataParallel
                                        : a.decomposition == int(Decomposition::StreamK)    ? Decomp::StreamK
                                                                                            : Decomp::Heuristic;
    return args;
  }

  static size_t workspace_bytes(const MixedGemmArgs& a) { return Adapter::get_workspace_size(arguments(a)); }

  static cudaError_t run(const MixedGemmArgs& a, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    Arguments args = arguments(a);
    if (Adapter::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    if (Adapter::get_workspace_size(args) > workspace_bytes) return cudaErrorInvalidValue;
    // The kernel's shared-memory size, once per process (a graph capture may not be the first call's place for it).
    static const cudaError_t attribute = cudaFuncSetAttribute(
        cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Kernel::SharedStorageSize));
    if (attribute != cudaSuccess) return attribute;
    // Stream-K's barriers count up and the kernel does not reset them: zero them before every launch.
    if (Kernel::initialize_workspace(args, workspace, stream, nullptr) != cutlass::Status::kSuccess) {
      return cudaErrorInvalidValue;
    }
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
    if (Adapter::run(params, stream) != cutlass::Status::kSuccess) {
      const cudaError_t e = cudaGetLastError();
      return e == cudaSuccess ? cudaErrorLaunchFailure : e;
    }
    return cudaGetLastError();
  }
};

// The kernels of one weight kind and layout, one per token tile: a call runs the one its MixedGemmArgs::tokens names
// (mixed_shape_error admits only kMixedTokenTiles).
template <class Codes, class Scales, bool kReordered, int... kTokens>
struct MixedTiles {
  static size_t workspace_bytes(const MixedGemmArgs& a) {
    size_t bytes = 0;
    ((a.tokens == kTokens ? (bytes = MixedGemm<Codes, Scales, kReordered, kTokens>::workspace_bytes(a), 0) : 0), ...);
    return bytes;
  }
  static cudaError_t run(const MixedGemmArgs& a, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    cudaError_t e = cudaErrorInvalidValue;
    ((a.tokens == kTokens
          ? (e = MixedGemm<Codes, Scales, kReordered, kTokens>::run(a, workspace, workspace_bytes, stream), 0)
          : 0),
     ...);
    return e;
  }
};

}  // namespace b12x::sm90

// Defines the kind's workspace and run functions (sm90_mixed_<kind>.cu): the kernels of one translation unit, the
// token tiles listed after the layout.
#define B12X_SM90_MIXED_KIND(NAME, CODES, SCALES, REORDERED, ...)                                            \
  namespace b12x::sm90 {                                                                                     \
  using Gemm_##NAME = MixedTiles<CODES, SCALES, REORDERED, __VA_ARGS__>;                                     \
  size_t mixed_workspace_##NAME(const MixedGemmArgs& a) { return Gemm_##NAME::workspace_bytes(a); }         \
  cudaError_t mixed_gemm_##NAME(const MixedGemmArgs& a, void* ws, size_t bytes, cudaStream_t s) {            \
    return Gemm_##NAME::run(a, ws, bytes, s);                                                                \
  }                                                                                                          \
  }
