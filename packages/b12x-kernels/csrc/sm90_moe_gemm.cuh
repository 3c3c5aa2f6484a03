// The grouped form of the SM90 mixed-input GEMM for the fused MoE (sm90_moe_nvfp4.cu, _mxfp4.cu include this once):
// CUTLASS's ptr-array mixed-input collective (sm90_mma_array_tma_gmma_rs_warpspecialized_mixed_input.hpp) under the
// KernelPtrArrayTmaWarpSpecializedCooperative schedule, its grouped persistent tile scheduler and the ptr-array TMA
// epilogue, over one problem per expert (GroupProblemShape) whose shapes, pointers and strides a small kernel writes
// into the workspace from the expert offsets on the device.
//
// Everything that converts b12x's formats is the linear kernel's (sm90_mixed_gemm.cuh): the e2m1 -> bf16 converter
// and the TileScales carrier with its MixedInputUtils::dequantize_A_kblock specialization, which matches any
// CollectiveMma whose A is (codes, TileScales), the ptr-array collective's too. So each expert's block scales move
// as that collective's one-per-group scale (group 64 = the k-tile: its own TMA descriptor per expert, swapped in when
// a CTA's tile changes expert) and each k-block picks its byte. The weight is in the checkpoint's layout (K-major
// rows), the one the other MoE backends that read "checkpoint" share.
//
// As in the linear kernel the operands are swapped (A = the expert's weight rows, B = its sorted activation rows,
// each problem N x rows_e x K), so D = Y_e^T column-major is Y_e row-major. The epilogue stores the accumulator (alpha
// 1, no source) as float32 or bf16: the per-row factors multiply in the caller's next pass (the activation, the
// combine).
#pragma once

#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "sm90_mixed_gemm.cuh"
#include "sm90_moe.h"

namespace b12x::sm90 {

// weight rows x tokens x k: a 128-token tile holds a prefill-sized expert's rows in few tiles
using MoeTile = cute::Shape<cute::_128, cute::_128, cute::Int<kTileK>>;
using MoeProblem = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (N, rows_e, K) per expert
// Built outside any template for the reason MixedEpilogue is (gcc and CUTLASS's epilogue builder). The output is
// float32 (the gate/up GEMM: its activation and the second GEMM's activation quantization read the unrounded product,
// as the reference does) or bf16 (the down GEMM, whose rows the combine sums).
using MoeEpilogueF32 = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, MoeTile, MixedCluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::ColumnMajor*, 4, float,
    cutlass::layout::ColumnMajor*, 4, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
using MoeEpilogueBf16 = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, MoeTile, MixedCluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::ColumnMajor*, 8,
    cutlass::bfloat16_t, cutlass::layout::ColumnMajor*, 8,
    cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

// Start of the part of the workspace after `bytes`, rounded up so every part is 128-byte aligned (TMA descriptors).
constexpr size_t moe_align(size_t bytes) { return (bytes + 127) / 128 * 128; }

template <class Scales_, class ElementY_>
struct MoeGemm {
  using Codes = cutlass::float_e2m1_t;
  using Scales = Scales_;
  using ElementX = cutlass::bfloat16_t;
  using ElementY = ElementY_;
  using Epilogue = cute::conditional_t<cute::is_same_v<ElementY, float>, MoeEpilogueF32, MoeEpilogueBf16>;
  static constexpr int kAlignW = 128 / cutlass::sizeof_bits<Codes>::value;
  static constexpr int kAlign16 = 8;

  using MainloopOp = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::tuple<Codes, Scales>, cutlass::layout::RowMajor*,
      kAlignW, ElementX, cutlass::layout::ColumnMajor*, kAlign16, float, MoeTile, MixedCluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<MoeProblem, MainloopOp, Epilogue>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Arguments = typename Kernel::Arguments;

  using Shape = typename MoeProblem::UnderlyingProblemShape;
  using StrideW = typename Kernel::InternalStrideA;
  using StrideX = typename Kernel::InternalStrideB;
  using StrideS = typename MainloopOp::NonVoidStrideScale;
  using StrideY = typename Kernel::InternalStrideD;

  // The per-expert arrays the problem kernel writes and the grouped GEMM reads, carved from the workspace's front.
  struct Table {
    Shape* shapes;
    const Codes** w;
    const ElementX** x;
    const Scales** scales;
    ElementY** y;
    StrideW* dw;
    StrideX* dx;
    StrideS* ds;
    StrideY* dy;
  };

  static size_t table_bytes(int experts) {
    const size_t e = size_t(experts);
    return moe_align(e * sizeof(Shape)) + 4 * moe_align(e * sizeof(void*)) + moe_align(e * sizeof(StrideW)) +
           moe_align(e * sizeof(StrideX)) + moe_align(e * sizeof(StrideS)) + moe_align(e * sizeof(StrideY));
  }

  static Table table_of(void* workspace, int experts) {
    char* p = static_cast<char*>(workspace);
    const size_t e = size_t(experts);
    const auto take = [&p](size_t bytes) {
      char* at = p;
      p += moe_align(bytes);
      return at;
    };
    Table t;
    t.shapes = reinterpret_cast<Shape*>(take(e * sizeof(Shape)));
    t.w = reinterpret_cast<const Codes**>(take(e * sizeof(void*)));
    t.x = reinterpret_cast<const ElementX**>(take(e * sizeof(void*)));
    t.scales = reinterpret_cast<const Scales**>(take(e * sizeof(void*)));
    t.y = reinterpret_cast<ElementY**>(take(e * sizeof(void*)));
    t.dw = reinterpret_cast<StrideW*>(take(e * sizeof(StrideW)));
    t.dx = reinterpret_cast<StrideX*>(take(e * sizeof(StrideX)));
    t.ds = reinterpret_cast<StrideS*>(take(e * sizeof(StrideS)));
    t.dy = reinterpret_cast<StrideY*>(take(e * sizeof(StrideY)));
    return t;
  }

  static Arguments arguments(const MoeGemmArgs& a, const Table& t) {
    Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = MoeProblem{a.experts, t.shapes, nullptr};  // shapes on the device only
    args.mainloop.ptr_A = t.w;
    args.mainloop.dA = t.dw;
    args.mainloop.ptr_B = t.x;
    args.mainloop.dB = t.dx;
    args.mainloop.ptr_S = t.scales;
    args.mainloop.dS = t.ds;
    args.mainloop.chunk_size = kTileK;  // one carrier per k-tile
    auto& fusion = args.epilogue.thread;
    fusion.alpha = 1.f;
    fusion.beta = 0.f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = t.dy;
    args.epilogue.ptr_D = t.y;
    args.epilogue.dD = t.dy;
    int device = 0;
    cudaGetDevice(&device);
    args.hw_info.device_id = device;
    args.hw_info.sm_count = a.sms;
    return args;
  }

  static size_t workspace_bytes(const MoeGemmArgs& a) {
    const Table null_table{};
    return table_bytes(a.experts) + Adapter::get_workspace_size(arguments(a, null_table));
  }

  static cudaError_t run(const MoeGemmArgs& a, void* workspace, size_t workspace_bytes, cudaStream_t stream);
};

// One thread per expert: its problem (N, rows, K), its weight, scales, activation and output bases, and the strides
// (the same for every expert; written here so the table is whole in device memory).
template <class G>
__global__ void moe_problems(MoeGemmArgs a, typename G::Table t) {
  using Scales = typename G::Scales;
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= a.experts) return;
  const int first = a.offsets[e];
  const int rows = a.offsets[e + 1] - first;
  const int64_t n = a.n, k = a.k;
  t.shapes[e] = typename G::Shape{a.n, rows, a.k};
  t.w[e] = reinterpret_cast<const cutlass::float_e2m1_t*>(static_cast<const uint8_t*>(a.w) + e * n * k / 2);
  t.scales[e] = static_cast<const Scales*>(a.scales) + e * (k / kTileK) * n;
  t.x[e] = static_cast<const cutlass::bfloat16_t*>(a.x) + int64_t(first) * k;
  t.y[e] = static_cast<typename G::ElementY*>(a.y) + int64_t(first) * n;
  t.dw[e] = cutlass::make_cute_packed_stride(typename G::StrideW{}, cute::make_shape(a.n, a.k, 1));
  t.dx[e] = cutlass::make_cute_packed_stride(typename G::StrideX{}, cute::make_shape(rows, a.k, 1));
  t.ds[e] = cutlass::make_cute_packed_stride(typename G::StrideS{}, cute::make_shape(a.n, a.k / kTileK, 1));
  t.dy[e] = cutlass::make_cute_packed_stride(typename G::StrideY{}, cute::make_shape(a.n, rows, 1));
}

template <class Scales, class ElementY>
cudaError_t MoeGemm<Scales, ElementY>::run(const MoeGemmArgs& a, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (workspace_bytes < MoeGemm::workspace_bytes(a)) return cudaErrorInvalidValue;
  const Table t = table_of(workspace, a.experts);
  void* kernel_workspace = static_cast<char*>(workspace) + table_bytes(a.experts);
  moe_problems<MoeGemm><<<(a.experts + 127) / 128, 128, 0, stream>>>(a, t);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  Arguments args = arguments(a, t);
  if (Adapter::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  // The kernel's shared-memory size, once per process (a graph capture may not be the first call's place for it).
  static const cudaError_t attribute = cudaFuncSetAttribute(
      cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Kernel::SharedStorageSize));
  if (attribute != cudaSuccess) return attribute;
  if (Kernel::initialize_workspace(args, kernel_workspace, stream, nullptr) != cutlass::Status::kSuccess) {
    return cudaErrorInvalidValue;
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, kernel_workspace);
  if (Adapter::run(params, stream) != cutlass::Status::kSuccess) {
    e = cudaGetLastError();
    return e == cudaSuccess ? cudaErrorLaunchFailure : e;
  }
  return cudaGetLastError();
}

}  // namespace b12x::sm90

// Defines the kind's workspace and run functions (sm90_moe_<kind>.cu): its two kernels (float32 and bf16 out) in one
// translation unit.
#define B12X_SM90_MOE_KIND(NAME, SCALES)                                                                     \
  namespace b12x::sm90 {                                                                                     \
  size_t moe_workspace_##NAME(const MoeGemmArgs& a) {                                                        \
    return a.y_float ? MoeGemm<SCALES, float>::workspace_bytes(a)                                            \
                     : MoeGemm<SCALES, cutlass::bfloat16_t>::workspace_bytes(a);                             \
  }                                                                                                          \
  cudaError_t moe_gemm_##NAME(const MoeGemmArgs& a, void* ws, size_t bytes, cudaStream_t s) {                \
    return a.y_float ? MoeGemm<SCALES, float>::run(a, ws, bytes, s)                                          \
                     : MoeGemm<SCALES, cutlass::bfloat16_t>::run(a, ws, bytes, s);                           \
  }                                                                                                          \
  }
