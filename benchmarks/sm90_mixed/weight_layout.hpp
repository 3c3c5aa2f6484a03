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

// CUTLASS's compute_memory_reordering_atom (tools/util/include/cutlass/util/mixed_dtype_utils.hpp, BSD-3),
// restated for one wgmma atom along K: that header pulls in curand through its fill helpers, which a CUDA
// install without curand's headers cannot compile.
template <class ValLayout>
constexpr auto reordering_atom() {
  using namespace cute;
  // A's thread-value layout of a 64x16 bf16 register-A wgmma (the tile's N and the major-ness do not change it).
  using MmaAtom = decltype(SM90::GMMA::rs_op_selector<MmaType, MmaType, float, Shape<_64, _16, _32>>());
  using MmaTraits = MMA_Traits<MmaAtom>;
  auto mk_shape_mma = select<0, 2>(typename MmaTraits::Shape_MNK{});
  auto tv_layout_mma = typename MmaTraits::ALayout{};
  static_assert(size<1>(tv_layout_mma) % size(ValLayout{}) == 0, "value layout must divide the MMA's values");
  // One warp's (m, k) -> (thread, value), inverted.
  auto tv_tiler_warp = make_shape(Int<32>{}, size<1>(tv_layout_mma));
  auto mk_shape_warp = shape_div(mk_shape_mma, size(typename MmaTraits::ThrID{}) / Int<32>{});
  auto tv_layout_mma_warp = make_layout_like(composition(tv_layout_mma, tv_tiler_warp));
  auto mk_layout_mma_warp = right_inverse(tv_layout_mma_warp).with_shape(mk_shape_warp);
  // One atom along K (example 55's NumShuffleAtoms = 1), kept in the same form as CUTLASS's helper.
  auto atom_layout = Layout<Shape<_1, _1>>{};
  auto mk_layout_mma_trgt = blocked_product(mk_layout_mma_warp, atom_layout);
  // Each thread's values contiguous, permuted within the run by ValLayout.
  auto val_to_offset = logical_product(ValLayout{}, size<1>(tv_layout_mma) / size(ValLayout{}) * size(atom_layout));
  auto thr_to_offset = make_layout(size<0>(tv_layout_mma_warp));
  auto tv_to_offset = select<1, 0>(logical_product(val_to_offset, thr_to_offset));
  return composition(tv_to_offset, mk_layout_mma_trgt);
}

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
