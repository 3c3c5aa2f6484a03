// One CUTLASS 3.x SM90 mixed-input GEMM: Y = X . W^T with W narrow (e4m3 or int4), X and Y bf16.
//
// Built the way CUTLASS example 55 (55_hopper_int4_bf16_gemm.cu) builds it, with these choices:
//  - the operands are swapped by hand (A = W, B = X, problem N x M x K), so the narrow W is the register operand
//    and the TMA epilogue can be used (the collective's implicit swap would forbid it); D is written N x M
//    column-major, which is Y row-major;
//  - mainloop: sm90_mma_tma_gmma_rs_warpspecialized_mixed_input (the builder picks it for unequal widths),
//    KernelTmaWarpSpecializedCooperative (one producer warp, two consumer warpgroups sharing each tile),
//    cluster 1x1x1, stages = as many as fit beside the epilogue's shared memory;
//  - e4m3: ConvertOnly (e4m3 -> bf16 in registers, no scales in the mainloop), alpha = the per-tensor scale in
//    the epilogue; int4: ConvertAndScale with bf16 scales, one per 128 k of each row (group 128), no zeros;
//  - the persistent stream-K tile scheduler (StreamKScheduler): data-parallel, heuristic or stream-K chosen at
//    run time from the same kernel;
//  - epilogue: TmaWarpSpecializedCooperative, no C operand (ElementC = void, beta = 0), bf16 D, fp32 compute.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/kernel_hardware_info.h"

#include "sm90_mixed.h"
#include "weight_layout.hpp"

namespace sm90mixed {

template <class Quant, class TileShape_>
struct MixedGemmConfig {
  using ElementW = Quant;
  using ElementX = cutlass::bfloat16_t;
  using ElementY = cutlass::bfloat16_t;
  using ElementScale = cutlass::bfloat16_t;
  using ElementAcc = float;
  static constexpr bool kScaled = cute::is_same_v<Quant, cutlass::int4b_t>;

  using TileShape = TileShape_;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;

  static constexpr int kAlignW = 128 / cutlass::sizeof_bits<ElementW>::value;
  static constexpr int kAlignX = 128 / cutlass::sizeof_bits<ElementX>::value;
  static constexpr int kAlignY = 128 / cutlass::sizeof_bits<ElementY>::value;

  // Swapped problem: A = W (N x K, K-major: "row-major A"), B = X (M x K, K-major: "column-major B"),
  // D = N x M column-major (= Y, M x N row-major).
  using LayoutX = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::ColumnMajor;
  using StrideWKernel = typename WeightLayout<Quant>::KernelStride;
  // The builder takes a layout tag or a cute layout; for the plain K-major case give it the tag.
  using LayoutWArg = cute::conditional_t<QuantTraits<Quant>::kShuffle, StrideWKernel, cutlass::layout::RowMajor>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      TileShape, ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto,
      ElementAcc, float,
      void, LayoutD, kAlignY,
      ElementY, LayoutD, kAlignY,
      EpilogueSchedule>::CollectiveOp;

  using MainloopElementW = cute::conditional_t<kScaled, cute::tuple<ElementW, ElementScale>, ElementW>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      MainloopElementW, LayoutWArg, kAlignW,
      ElementX, LayoutX, kAlignX,
      ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, cutlass::gemm::StreamKScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using Arguments = typename Gemm::Arguments;
  using StrideX = typename GemmKernel::StrideB;
  using StrideD = typename GemmKernel::StrideD;
};

inline const char* status_name(cutlass::Status s) { return cutlass::cutlassGetStatusString(s); }

template <class Cfg>
class MixedGemmPlan final : public GemmPlan {
 public:
  ~MixedGemmPlan() override {
    if (workspace_ != nullptr) cudaFree(workspace_);
  }

  bool init(const MixedProblem& p, std::string& err) {
    using namespace cute;
    using Decomposition = cutlass::gemm::kernel::detail::DecompositionMode;
    using W = typename Cfg::ElementW;
    using X = typename Cfg::ElementX;
    using Y = typename Cfg::ElementY;

    auto dW = WeightLayout<W>::kernel_stride(p.N, p.K);
    auto dX = cutlass::make_cute_packed_stride(typename Cfg::StrideX{}, make_shape(p.M, p.K, 1));
    auto dD = cutlass::make_cute_packed_stride(typename Cfg::StrideD{}, make_shape(p.N, p.M, 1));

    typename Cfg::Arguments& a = args_;
    a.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    a.problem_shape = {p.N, p.M, p.K, 1};
    a.mainloop.ptr_A = static_cast<W const*>(p.W);
    a.mainloop.dA = dW;
    a.mainloop.ptr_B = static_cast<X const*>(p.X);
    a.mainloop.dB = dX;
    if constexpr (Cfg::kScaled) {
      using StrideS = typename Cfg::CollectiveMainloop::StrideScale;
      if (p.scales == nullptr || p.group <= 0 || p.K % p.group != 0) {
        err = "int4 kernel needs bf16 scales and a group dividing K";
        return false;
      }
      a.mainloop.ptr_S = static_cast<typename Cfg::ElementScale const*>(p.scales);
      a.mainloop.dS = cutlass::make_cute_packed_stride(StrideS{}, make_shape(p.N, p.K / p.group, 1));
      a.mainloop.group_size = p.group;
    }
    a.epilogue.thread.alpha = p.alpha;
    a.epilogue.thread.beta = 0.f;
    a.epilogue.ptr_C = nullptr;
    a.epilogue.dC = dD;
    a.epilogue.ptr_D = static_cast<Y*>(p.Y);
    a.epilogue.dD = dD;
    a.hw_info.device_id = p.device;
    a.hw_info.sm_count = p.sm_count;
    switch (p.decomp) {
      case Decomp::DataParallel: a.scheduler.decomposition_mode = Decomposition::DataParallel; break;
      case Decomp::Heuristic: a.scheduler.decomposition_mode = Decomposition::Heuristic; break;
      case Decomp::StreamK: a.scheduler.decomposition_mode = Decomposition::StreamK; break;
    }

    cutlass::Status st = gemm_.can_implement(a);
    if (st != cutlass::Status::kSuccess) {
      err = std::string("can_implement: ") + status_name(st);
      return false;
    }
    size_t ws = Cfg::Gemm::get_workspace_size(a);
    if (ws > 0) {
      cudaError_t ce = cudaMalloc(&workspace_, ws);
      if (ce != cudaSuccess) {
        workspace_ = nullptr;
        err = std::string("workspace cudaMalloc(") + std::to_string(ws) + "): " + cudaGetErrorString(ce);
        return false;
      }
    }
    // initialize() zeroes the stream-K barriers and sets the kernel's shared-memory attribute (outside any
    // graph capture); enqueue() zeroes the barriers again before each launch.
    st = gemm_.initialize(a, workspace_, nullptr);
    if (st != cutlass::Status::kSuccess) {
      err = std::string("initialize: ") + status_name(st);
      return false;
    }
    cudaError_t ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess) {
      err = std::string("after initialize: ") + cudaGetErrorString(ce);
      return false;
    }
    return true;
  }

  bool enqueue(cudaStream_t s, std::string& err) override {
    // The stream-K fixup's barriers count up and are not reset by the kernel: zero them before every launch
    // (a no-op when the decomposition is data-parallel, which needs no barriers).
    cutlass::Status st = Cfg::GemmKernel::initialize_workspace(args_, workspace_, s, nullptr);
    if (st != cutlass::Status::kSuccess) {
      err = std::string("initialize_workspace: ") + status_name(st);
      return false;
    }
    st = gemm_.run(s);
    if (st != cutlass::Status::kSuccess) {
      err = std::string("run: ") + status_name(st);
      cudaError_t ce = cudaGetLastError();
      if (ce != cudaSuccess) err += std::string(" (") + cudaGetErrorString(ce) + ")";
      return false;
    }
    return true;
  }

 private:
  typename Cfg::Gemm gemm_;
  typename Cfg::Arguments args_{};
  void* workspace_ = nullptr;
};

template <class Cfg>
std::unique_ptr<GemmPlan> make_mixed_plan(const MixedProblem& p, std::string& err) {
  auto plan = std::make_unique<MixedGemmPlan<Cfg>>();
  if (!plan->init(p, err)) return nullptr;
  return plan;
}

}  // namespace sm90mixed

// Defines kernel_<NAME>() in the namespace: one CUTLASS kernel per translation unit.
#define SM90_MIXED_DEFINE_KERNEL(NAME, QUANT, TM, TN, TK, WTYPE, DESC)                                       \
  namespace sm90mixed {                                                                                    \
  using Cfg_##NAME = MixedGemmConfig<QUANT, cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Int<TK>>>;    \
  const KernelEntry& kernel_##NAME() {                                                                     \
    static const KernelEntry e{#NAME, WTYPE, DESC, &make_mixed_plan<Cfg_##NAME>};                          \
    return e;                                                                                              \
  }                                                                                                        \
  }
