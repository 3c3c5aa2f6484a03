// The weight's memory layout, shared by the offline reorder (reorder.cu) and the kernels (kernel_*.cu).
//
// The weight W is N x K, K-major (a torch nn.Linear weight). The kernels run the swapped problem
// Y^T (N x M) = W (N x K) . X^T, so W is CUTLASS's A operand: the narrow type, converted in registers.
//
// The reorder (CUTLASS's compute_memory_reordering_atom with one atom along K, as example 55 uses it) puts the values one thread
// of a 64x16 bf16 wgmma A-fragment reads next to each other in memory, so that the shared-memory -> register
// copy is one wide load instead of several sub-word loads. For int4 the values inside that run are also
// permuted to [0,2,4,6,1,3,5,7], the order CUTLASS's fast int4 -> bf16 converter (lop3 + one bf16x2 sub per
// pair, LayoutAwareConvertImpl in cutlass/detail/collective/mixed_input_utils.hpp) expects.
// For e4m3 there is no permuted converter in CUTLASS 4.2, so its runs keep the natural order (identity value
// layout) and the generic NumericArrayConverter<bf16, e4m3> converts them. SM90_MIXED_FP8_SHUFFLE=0 builds
// the e4m3 kernels on the plain K-major layout instead (example 55's e4m3 path, no reorder). The reorder is a
// pure relayout: the kernel reads W through the reordered cute layout, so logical (n, k) still means W[n][k].
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/layout/matrix.h"
#include "cutlass/gemm/gemm.h"
#include "cutlass/util/packed_stride.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "../../packages/b12x-kernels/csrc/sm90_mixed_layout.cuh"

#ifndef SM90_MIXED_FP8_SHUFFLE
#define SM90_MIXED_FP8_SHUFFLE 1
#endif

namespace sm90mixed {

using MmaType = cutlass::bfloat16_t;

// (N, K, L) with K contiguous: Stride<int64_t, _1, int64_t>.
using StrideW = cutlass::detail::TagToStrideB_t<cutlass::layout::ColumnMajor>;

template <class Quant> struct QuantTraits;

template <> struct QuantTraits<cutlass::float_e4m3_t> {
  static constexpr bool kShuffle = SM90_MIXED_FP8_SHUFFLE != 0;
  using ValueShuffle = cute::Layout<cute::_1>;  // no value permutation
};

template <> struct QuantTraits<cutlass::int4b_t> {
  static constexpr bool kShuffle = true;
  using ValueShuffle = cute::Layout<cute::Shape<cute::_2, cute::_4>, cute::Stride<cute::_4, cute::_1>>;  // [0,2,4,6,1,3,5,7]
};

// The reordering atom is the package's (packages/b12x-kernels/csrc/sm90_mixed_layout.cuh): one definition for the
// kernels b12x ships and this probe.
using b12x::sm90::reordering_atom;

template <class Quant>
struct WeightLayout {
  using Atom = decltype(reordering_atom<typename QuantTraits<Quant>::ValueShuffle>());
  using Reordered = decltype(cute::tile_to_shape(Atom{}, cute::Layout<cute::Shape<int, int, int>, StrideW>{}));
  // What the kernel is given as A's "stride": the reordered layout, or the plain K-major stride.
  using KernelStride = cute::conditional_t<QuantTraits<Quant>::kShuffle, Reordered, StrideW>;

  static StrideW plain(int N, int K) { return cutlass::make_cute_packed_stride(StrideW{}, cute::make_shape(N, K, 1)); }
  static Reordered reordered(int N, int K) { return cute::tile_to_shape(Atom{}, cute::make_shape(N, K, 1)); }
  static KernelStride kernel_stride(int N, int K) {
    if constexpr (QuantTraits<Quant>::kShuffle) {
      return reordered(N, K);
    } else {
      return plain(N, K);
    }
  }
};

}  // namespace sm90mixed
