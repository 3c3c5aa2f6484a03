// The weight layout the SM90 mixed-input kernels read (sm90_mixed_gemm.cuh) and the prepare-time reorder writes
// (sm90_mixed_reorder.cu): one definition for both.
//
// W is N x K, K-major (a torch nn.Linear weight), CUTLASS's A operand. The reorder puts the values one thread of a
// 64 x 16 bf16 wgmma A-fragment reads next to each other in memory, so the shared-memory -> register copy is one
// wide load instead of several sub-word ones (CUTLASS's compute_memory_reordering_atom with one atom along K, as its
// example 55 uses it, restated: that header pulls in curand). 4-bit codes are also permuted inside each run to
// [0,2,4,6,1,3,5,7], the order the shift-and-mask converters take. The reorder is a pure relayout: the kernel reads W
// through the reordered cute layout, so logical (n, k) still means W[n][k].
#pragma once

#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/gemm.h"
#include "cutlass/layout/matrix.h"
#include "cutlass/numeric_types.h"
#include "cutlass/util/packed_stride.hpp"

namespace b12x::sm90 {

// The mainloop's k-tile: 64 deep (128 bytes of bf16 activations a row, one TMA box).
constexpr int kTileK = 64;

template <class Codes>
struct ValueOrder {
  using type = cute::Layout<cute::_1>;  // 8-bit codes: natural order
};
template <>
struct ValueOrder<cutlass::float_e2m1_t> {
  using type = cute::Layout<cute::Shape<cute::_2, cute::_4>, cute::Stride<cute::_4, cute::_1>>;  // [0,2,4,6,1,3,5,7]
};

template <class ValLayout>
constexpr auto reordering_atom() {
  using namespace cute;
  // A's thread-value layout of a 64x16 bf16 register-A wgmma (the tile's N and the major-ness do not change it).
  using MmaAtom = decltype(SM90::GMMA::rs_op_selector<cutlass::bfloat16_t, cutlass::bfloat16_t, float,
                                                      Shape<_64, _16, _32>>());
  using MmaTraits = MMA_Traits<MmaAtom>;
  auto mk_shape_mma = select<0, 2>(typename MmaTraits::Shape_MNK{});
  auto tv_layout_mma = typename MmaTraits::ALayout{};
  static_assert(size<1>(tv_layout_mma) % size(ValLayout{}) == 0, "the value order must divide the MMA's values");
  // One warp's (m, k) -> (thread, value), inverted.
  auto tv_tiler_warp = make_shape(Int<32>{}, size<1>(tv_layout_mma));
  auto mk_shape_warp = shape_div(mk_shape_mma, size(typename MmaTraits::ThrID{}) / Int<32>{});
  auto tv_layout_mma_warp = make_layout_like(composition(tv_layout_mma, tv_tiler_warp));
  auto mk_layout_mma_warp = right_inverse(tv_layout_mma_warp).with_shape(mk_shape_warp);
  auto atom_layout = Layout<Shape<_1, _1>>{};
  auto mk_layout_mma_trgt = blocked_product(mk_layout_mma_warp, atom_layout);
  // Each thread's values contiguous, ordered inside the run by ValLayout.
  auto val_to_offset = logical_product(ValLayout{}, size<1>(tv_layout_mma) / size(ValLayout{}) * size(atom_layout));
  auto thr_to_offset = make_layout(size<0>(tv_layout_mma_warp));
  auto tv_to_offset = select<1, 0>(logical_product(val_to_offset, thr_to_offset));
  return composition(tv_to_offset, mk_layout_mma_trgt);
}

// kReordered: the reordered layout above; otherwise the checkpoint's own (K-major rows, 4-bit codes two a byte, even
// k in the low nibble), which other backends read too.
template <class Codes, bool kReordered>
struct WeightLayout {
  // (N, K, L) with K contiguous
  using Plain = cutlass::detail::TagToStrideA_t<cutlass::layout::RowMajor>;
  using Atom = decltype(reordering_atom<typename ValueOrder<Codes>::type>());
  using Reordered = decltype(cute::tile_to_shape(Atom{}, cute::Layout<cute::Shape<int, int, int>, Plain>{}));
  // What the builder is given for A: the reordered cute layout, or the plain layout's tag.
  using Builder = cute::conditional_t<kReordered, Reordered, cutlass::layout::RowMajor>;
  static auto of(int n, int k) {
    if constexpr (kReordered) {
      return cute::tile_to_shape(Atom{}, cute::make_shape(n, k, 1));
    } else {
      return cutlass::make_cute_packed_stride(Plain{}, cute::make_shape(n, k, 1));
    }
  }
};

}  // namespace b12x::sm90
