// b12x_kernels._C: a narrow binding over device pointers, sizes and a stream (no libtorch), so one binary
// serves any torch version. Host-side checks here are the cheap ones; b12x_core validates shapes and dtypes.
#include <pybind11/pybind11.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "fragment_mma.h"
#include "kernels.h"
#include "sm90_mixed.h"
#include "sm90_moe.h"

namespace py = pybind11;

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// M tokens in a launch whose accumulator bucket (the plan's configuration) holds max_m.
void check_tokens(const char* what, int M, int max_m) {
  if (max_m != 1 && max_m != 2 && max_m != 4 && max_m != 8 && max_m != 16)
    throw std::invalid_argument(std::string(what) + ": max_m must be 1, 2, 4, 8 or 16, got " + std::to_string(max_m));
  if (M < 1 || M > max_m)
    throw std::invalid_argument(std::string(what) + ": M must be in 1..max_m=" + std::to_string(max_m) + ", got " +
                                std::to_string(M));
}

template <class T>
T* ptr(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

// An argument block's bytes (b12x_kernels.interface.pack) as its struct; the size guards against a stale interface.
template <class Args>
Args args_of(const py::bytes& bytes, const char* what) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(bytes.ptr(), &data, &size) != 0) throw py::error_already_set();
  if (size_t(size) != sizeof(Args))
    throw std::invalid_argument(std::string(what) + ": an argument block of " + std::to_string(size) +
                                " bytes, the kernels' is " + std::to_string(sizeof(Args)) +
                                " (b12x_kernels.interface and csrc/interface.h differ)");
  Args args;
  std::memcpy(&args, data, sizeof(Args));
  return args;
}

cudaStream_t stream_of(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "b12x CUDA kernels (pointers in, no torch dependency)";

  m.def("device_count", []() -> py::tuple {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error
      return py::make_tuple(0, std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err));
    }
    return py::make_tuple(n, std::string());
  });

  m.def("compiled_archs", [] { return std::string(B12X_ARCHS_STRING); });

  // One binding per family: the argument block's bytes, then what changes per call.
  m.def(
      "gemv_ggml",
      [](const py::bytes& args_bytes, std::uintptr_t x, std::uintptr_t bias, std::uintptr_t y, int M,
         std::uintptr_t stream) {
        const auto p = args_of<b12x::GemvGgmlArgs>(args_bytes, "gemv_ggml");
        check_tokens("gemv_ggml", M, p.max_m);
        int group = 0;
        switch (p.format) {
          case b12x::FMT_Q8_0: group = b12x::Q8_0_GROUP; break;
          case b12x::FMT_IQ2_XXS: group = b12x::IQ2_XXS_GROUP; break;
          case b12x::FMT_IQ2_XS: group = b12x::IQ2_XS_GROUP; break;
          default: throw std::invalid_argument("gemv_ggml: format " + std::to_string(p.format) + " is no GGML format");
        }
        if (p.K % group) throw std::invalid_argument("gemv_ggml: K must be a multiple of the block size");
        if (!p.w || !x || !y || (p.format != b12x::FMT_Q8_0 && !p.grid))
          throw std::invalid_argument("gemv_ggml: null pointer");
        check(b12x::gemv_ggml(p, ptr<const __nv_bfloat16>(x), ptr<const __nv_bfloat16>(bias), ptr<__nv_bfloat16>(y),
                              M, stream_of(stream)),
              "gemv_ggml launch");
      },
      py::arg("args"), py::arg("x"), py::arg("bias"), py::arg("y"), py::arg("M"), py::arg("stream"));

  m.def(
      "gemv_elem",
      [](const py::bytes& args_bytes, std::uintptr_t x, std::uintptr_t x_scale, std::uintptr_t bias, std::uintptr_t y,
         int M, std::uintptr_t stream) {
        const auto p = args_of<b12x::GemvElemArgs>(args_bytes, "gemv_elem");
        check_tokens("gemv_elem", M, p.max_m);
        if (p.K % 8) throw std::invalid_argument("gemv_elem: K must be a multiple of 8");
        if (!p.w || !x || !y || (p.format != b12x::FMT_FP8 && !p.scales))
          throw std::invalid_argument("gemv_elem: null pointer");
        const int groups = (p.K + b12x::FP8_BLOCK_SIZE - 1) / b12x::FP8_BLOCK_SIZE;
        if (x_scale && p.x_scale_cols != 1 && p.x_scale_cols != groups)
          throw std::invalid_argument("gemv_elem: x_scale_cols must be 1 or ceil(K/128)");
        check(b12x::gemv_elem(p, ptr<const __nv_bfloat16>(x), ptr<const float>(x_scale), ptr<const __nv_bfloat16>(bias),
                              ptr<__nv_bfloat16>(y), M, stream_of(stream)),
              "gemv_elem launch");
      },
      py::arg("args"), py::arg("x"), py::arg("x_scale"), py::arg("bias"), py::arg("y"), py::arg("M"),
      py::arg("stream"));

  m.def("mma_blocks_per_sm", &b12x::mma_blocks_per_sm, py::arg("format"), py::arg("mt"), py::arg("rt"),
        py::arg("tiles") = 8);
  m.def("mma_smem_bytes", &b12x::mma_smem_bytes, py::arg("format"), py::arg("mt"), py::arg("tiles") = 8,
        py::arg("resident_rows") = 0, py::arg("chunks_per_split") = 0);

  m.def(
      "mma_gemm",
      [](const py::bytes& args_bytes, std::uintptr_t x, std::uintptr_t bias, std::uintptr_t y, int M,
         std::uintptr_t partials, std::uintptr_t tickets, std::uintptr_t stream, std::uintptr_t order,
         std::uintptr_t table, int blocks, std::uintptr_t ids, int experts, std::uintptr_t combine_w, int combine_k) {
        const auto p = args_of<b12x::MmaArgs>(args_bytes, "mma_gemm");
        if (const char* error = b12x::mma_args_error(p)) throw std::invalid_argument(error);
        const bool f32 = p.epilogue == b12x::MMA_OUT_F32;
        if (M < 1) throw std::invalid_argument("mma_gemm: need M >= 1");
        if ((p.splits > 1 || f32) && !partials) throw std::invalid_argument("mma_gemm: split K or f32 needs partials");
        if (p.splits > 1 && !f32 && !tickets) throw std::invalid_argument("mma_gemm: split K needs tickets");
        if (!x || (!y && !f32) || x % 16) throw std::invalid_argument("mma_gemm: null or misaligned x / y");
        if (order && (!table || blocks < 1 || p.N % 16))
          throw std::invalid_argument("mma_gemm: grouped needs the block table, blocks >= 1 and N % 16 == 0");
        if (ids && (order || table))
          throw std::invalid_argument("mma_gemm: routed in the kernel (ids) or by a block table (order), not both");
        if (ids && (blocks < 1 || p.N % 16 || M > b12x::MMA_ROUTE_MAX_SLOTS || experts < 1 ||
                    experts > b12x::MMA_ROUTE_MAX_EXPERTS))
          throw std::invalid_argument("mma_gemm: routed in the kernel (ids) needs blocks >= 1, N % 16 == 0, M <= " +
                                      std::to_string(b12x::MMA_ROUTE_MAX_SLOTS) + " slots and 1 <= experts <= " +
                                      std::to_string(b12x::MMA_ROUTE_MAX_EXPERTS));
        if (combine_w && (!f32 || !(order || ids) || !y || !tickets || combine_k < 1 || M % combine_k))
          throw std::invalid_argument("mma_gemm: the combine (combine_w) needs the f32 epilogue, a grouped call, y, "
                                      "tickets and M a multiple of combine_k >= 1");
        if (p.resident && b12x::mma_resident_smem_bytes(p, M) > 227 * 1024)
          throw std::invalid_argument("mma_gemm: resident activations of this call (M rows x the split's K) exceed "
                                      "227 KB of shared memory; take more K splits or the staged plan");
        b12x::MmaCall call{ptr<const __nv_bfloat16>(x), ptr<const __nv_bfloat16>(bias), ptr<__nv_bfloat16>(y), M,
                           ptr<float>(partials), ptr<int>(tickets), ptr<const int>(order), ptr<const int>(table),
                           blocks, ptr<const int>(ids), experts, ptr<const float>(combine_w), combine_k};
        check(b12x::mma_gemm(p, call, stream_of(stream)), "mma_gemm launch");
      },
      py::arg("args"), py::arg("x"), py::arg("bias"), py::arg("y"), py::arg("M"), py::arg("partials"),
      py::arg("tickets"), py::arg("stream"), py::arg("order") = 0, py::arg("table") = 0, py::arg("blocks") = 0,
      py::arg("ids") = 0, py::arg("experts") = 0, py::arg("combine_w") = 0, py::arg("combine_k") = 0);

  // The Hopper form of the tensor-core GEMM (csrc/wgmma_gemm.cu): the same argument block and call as mma_gemm, plus
  // the scratch its activation staging writes (kernels.h says its size; b12x_core.tensor_core.wgmma.staged_bytes).
  m.def("wgmma_blocks_per_sm", &b12x::wgmma_blocks_per_sm, py::arg("format"), py::arg("mt"));
  m.def(
      "wgmma_gemm",
      [](const py::bytes& args_bytes, std::uintptr_t x, std::uintptr_t bias, std::uintptr_t y, int M,
         std::uintptr_t partials, std::uintptr_t tickets, std::uintptr_t staged, std::uintptr_t stream,
         std::uintptr_t order, std::uintptr_t table, int blocks) {
        const auto p = args_of<b12x::MmaArgs>(args_bytes, "wgmma_gemm");
        if (const char* error = b12x::wgmma_args_error(p)) throw std::invalid_argument(error);
        const bool f32 = p.epilogue == b12x::MMA_OUT_F32;
        if (M < 1) throw std::invalid_argument("wgmma_gemm: need M >= 1");
        if ((p.splits > 1 || f32) && !partials) throw std::invalid_argument("wgmma_gemm: split K or f32 needs partials");
        if (p.splits > 1 && !f32 && !tickets) throw std::invalid_argument("wgmma_gemm: split K needs tickets");
        if (!x || (!y && !f32) || x % 16) throw std::invalid_argument("wgmma_gemm: null or misaligned x / y");
        if (y % 2 || bias % 2) throw std::invalid_argument("wgmma_gemm: misaligned y / bias");
        if (!staged || staged % 16) throw std::invalid_argument("wgmma_gemm: null or misaligned staged scratch");
        if (order && (!table || blocks < 1 || p.N % 16))
          throw std::invalid_argument("wgmma_gemm: grouped needs the block table, blocks >= 1 and N % 16 == 0");
        if (order && p.mt < 4) throw std::invalid_argument("wgmma_gemm: the grouped form runs mt 4, 8 or 16");
        if (order && p.tiles != 8)
          throw std::invalid_argument("wgmma_gemm: the grouped form runs 128-row CTAs (tiles 8)");
        if (order && p.format == b12x::FMT_FP8_BLOCK)
          throw std::invalid_argument("wgmma_gemm: the grouped form runs no FP8_BLOCK (a dense weight's 128x128 block "
                                      "scales); of the per-chunk factor formats, IQ2's");
        b12x::MmaCall call{ptr<const __nv_bfloat16>(x), ptr<const __nv_bfloat16>(bias), ptr<__nv_bfloat16>(y), M,
                           ptr<float>(partials), ptr<int>(tickets), ptr<const int>(order), ptr<const int>(table),
                           blocks, nullptr, 0, nullptr, 0};  // routed in the kernel and the combine: mma_gemm's
        check(b12x::wgmma_gemm(p, call, ptr<uint8_t>(staged), stream_of(stream)), "wgmma_gemm launch");
      },
      py::arg("args"), py::arg("x"), py::arg("bias"), py::arg("y"), py::arg("M"), py::arg("partials"),
      py::arg("tickets"), py::arg("staged"), py::arg("stream"), py::arg("order") = 0, py::arg("table") = 0,
      py::arg("blocks") = 0);

  m.def(
      "mma_dequantize",
      [](const py::bytes& args_bytes, std::uintptr_t out, std::uintptr_t stream) {
        const auto p = args_of<b12x::MmaArgs>(args_bytes, "mma_dequantize");
        if (const char* error = b12x::mma_dequantize_error(p)) throw std::invalid_argument(error);
        if (!out || out % 16) throw std::invalid_argument("mma_dequantize: null or misaligned out (16 bytes)");
        check(b12x::mma_dequantize(p, ptr<__nv_bfloat16>(out), stream_of(stream)), "mma_dequantize launch");
      },
      py::arg("args"), py::arg("out"), py::arg("stream"));

  // SM12x's block-scaled mma.sync (csrc/block_scaled_mma.cuh) once per warp for each of `fragments` fragments of
  // lane registers (kernels.h says the layout): the instruction on sm_120a / sm_121a, its emulation elsewhere.
  m.def(
      "block_scaled_mma_probe",
      [](int kind, std::uintptr_t a, std::uintptr_t b, std::uintptr_t c, std::uintptr_t sfa, std::uintptr_t sfb,
         std::uintptr_t d, int fragments, int byte_id_a, int thread_id_a, int byte_id_b, int thread_id_b,
         std::uintptr_t stream) {
        if (const char* error = b12x::block_scaled_mma_probe_error(kind, byte_id_a, thread_id_a, byte_id_b,
                                                                   thread_id_b))
          throw std::invalid_argument(error);
        if (fragments < 0) throw std::invalid_argument("block_scaled_mma_probe: need fragments >= 0");
        if (fragments && (!a || !b || !c || !sfa || !sfb || !d || (a | b | c | sfa | sfb | d) % 4))
          throw std::invalid_argument("block_scaled_mma_probe: null or misaligned (4 bytes) pointer");
        check(b12x::block_scaled_mma_probe(kind, ptr<const uint32_t>(a), ptr<const uint32_t>(b), ptr<const float>(c),
                                           ptr<const uint32_t>(sfa), ptr<const uint32_t>(sfb), ptr<float>(d),
                                           fragments, byte_id_a, thread_id_a, byte_id_b, thread_id_b,
                                           stream_of(stream)),
              "block_scaled_mma_probe launch");
      },
      py::arg("kind"), py::arg("a"), py::arg("b"), py::arg("c"), py::arg("sfa"), py::arg("sfb"), py::arg("d"),
      py::arg("fragments"), py::arg("byte_id_a"), py::arg("thread_id_a"), py::arg("byte_id_b"),
      py::arg("thread_id_b"), py::arg("stream"));

  // SM12x's block-scaled mma.sync GEMM (csrc/bsmma_gemm.cu): the activation pass into xq / xs, then the GEMM.
  m.def(
      "bsmma_gemm",
      [](const py::bytes& args_bytes, std::uintptr_t x, std::uintptr_t xq, std::uintptr_t xs, std::uintptr_t bias,
         std::uintptr_t y, int M, std::uintptr_t stream) {
        const auto p = args_of<b12x::BsmmaArgs>(args_bytes, "bsmma_gemm");
        if (const char* error = b12x::bsmma_args_error(p)) throw std::invalid_argument(error);
        if (M < 1) throw std::invalid_argument("bsmma_gemm: need M >= 1");
        if (!x || !xq || !xs || !y || xq % 16 || xs % 4 || x % 2)
          throw std::invalid_argument("bsmma_gemm: null or misaligned x / xq (16 bytes) / xs (4 bytes) / y");
        check(b12x::bsmma_gemm(p, ptr<const __nv_bfloat16>(x), ptr<uint8_t>(xq), ptr<uint8_t>(xs),
                               ptr<const __nv_bfloat16>(bias), ptr<__nv_bfloat16>(y), M, stream_of(stream)),
              "bsmma_gemm launch");
      },
      py::arg("args"), py::arg("x"), py::arg("xq"), py::arg("xs"), py::arg("bias"), py::arg("y"), py::arg("M"),
      py::arg("stream"));
  m.def(
      "bsmma_quantize",
      [](const py::bytes& args_bytes, std::uintptr_t x, std::uintptr_t xq, std::uintptr_t xs, int M,
         std::uintptr_t stream) {
        const auto p = args_of<b12x::BsmmaArgs>(args_bytes, "bsmma_quantize");
        if (const char* error = b12x::bsmma_args_error(p)) throw std::invalid_argument(error);
        if (p.kind == b12x::BSMMA_KIND_FP8) throw std::invalid_argument("bsmma_quantize: FP8 takes the fp8 pass's codes");
        if (M < 1) throw std::invalid_argument("bsmma_quantize: need M >= 1");
        if (!x || !xq || !xs || xq % 16 || xs % 4 || x % 2)
          throw std::invalid_argument("bsmma_quantize: null or misaligned x / xq (16 bytes) / xs (4 bytes)");
        check(b12x::bsmma_quantize(p, ptr<const __nv_bfloat16>(x), ptr<uint8_t>(xq), ptr<uint8_t>(xs), M,
                                   stream_of(stream)),
              "bsmma_quantize launch");
      },
      py::arg("args"), py::arg("x"), py::arg("xq"), py::arg("xs"), py::arg("M"), py::arg("stream"));
  m.def(
      "bsmma_mma",
      [](const py::bytes& args_bytes, std::uintptr_t xq, std::uintptr_t xs, std::uintptr_t x_row_scale,
         std::uintptr_t table, int blocks, std::uintptr_t bias, std::uintptr_t y, int M, std::uintptr_t stream) {
        const auto p = args_of<b12x::BsmmaArgs>(args_bytes, "bsmma_mma");
        if (const char* error = b12x::bsmma_args_error(p)) throw std::invalid_argument(error);
        if (M < 1) throw std::invalid_argument("bsmma_mma: need M >= 1");
        if (table && (blocks < 1 || table % 4)) throw std::invalid_argument("bsmma_mma: a table needs blocks >= 1");
        if (!xq || !y || xq % 16 || (p.kind != b12x::BSMMA_KIND_FP8 && (!xs || xs % 4)) || x_row_scale % 4 ||
            y % 4)
          throw std::invalid_argument("bsmma_mma: null or misaligned xq (16 bytes) / xs (4 bytes) / y");
        check(b12x::bsmma_mma(p, ptr<const uint8_t>(xq), ptr<const uint8_t>(xs), ptr<const float>(x_row_scale),
                              ptr<const int>(table), blocks, ptr<const __nv_bfloat16>(bias), ptr<void>(y), M,
                              stream_of(stream)),
              "bsmma_mma launch");
      },
      py::arg("args"), py::arg("xq"), py::arg("xs"), py::arg("x_row_scale"), py::arg("table"), py::arg("blocks"),
      py::arg("bias"), py::arg("y"), py::arg("M"), py::arg("stream"));
  m.def(
      "bsmma_x_bytes",
      [](int kind, int M, int units, bool scales) { return b12x::bsmma_x_bytes(kind, M, units, scales); },
      py::arg("kind"), py::arg("M"), py::arg("units"), py::arg("scales"));

  // The Hopper mixed-input GEMM on CUTLASS's SM90 pieces (csrc/sm90_mixed.h; compiled for sm_90a only, and only
  // when the build targets sm_90: sm90_mixed_built says whether this build holds it).
  m.def("sm90_mixed_built", &b12x::sm90::mixed_built);
  const auto mixed_args = [](int weight, bool reordered, int m_, int n, int k, std::uintptr_t w,
                             std::uintptr_t scales, std::uintptr_t x, std::uintptr_t y, std::uintptr_t alpha,
                             std::uintptr_t bias, int decomposition, int sms, int tokens) {
    b12x::sm90::MixedGemmArgs a;
    a.weight = weight, a.reordered = reordered, a.m = m_, a.n = n, a.k = k, a.decomposition = decomposition;
    a.sms = sms, a.tokens = tokens;
    a.w = ptr<const void>(w), a.scales = ptr<const void>(scales), a.x = ptr<const void>(x), a.y = ptr<void>(y);
    a.alpha = ptr<const float>(alpha), a.bias = ptr<const void>(bias);
    if (!b12x::sm90::mixed_built()) throw std::runtime_error("sm90_mixed: this build holds no sm_90a kernels");
    if (const char* error = b12x::sm90::mixed_args_error(a))
      throw std::invalid_argument(std::string("sm90_mixed: ") + error);
    return a;
  };
  m.def(
      "sm90_mixed_workspace_bytes",
      [](int weight, bool reordered, int m_, int n, int k, int decomposition, int sms, int tokens) {
        if (!b12x::sm90::mixed_built()) throw std::runtime_error("sm90_mixed: this build holds no sm_90a kernels");
        b12x::sm90::MixedGemmArgs a;
        a.weight = weight, a.reordered = reordered, a.m = m_, a.n = n, a.k = k, a.decomposition = decomposition;
        a.sms = sms, a.tokens = tokens;
        if (const char* error = b12x::sm90::mixed_shape_error(a))
          throw std::invalid_argument(std::string("sm90_mixed: ") + error);
        return b12x::sm90::mixed_workspace_bytes(a);
      },
      py::arg("weight"), py::arg("reordered"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("decomposition"),
      py::arg("sms"), py::arg("tokens") = 128);
  m.def(
      "sm90_mixed_gemm",
      [mixed_args](int weight, bool reordered, int m_, int n, int k, std::uintptr_t w, std::uintptr_t scales,
                   std::uintptr_t x, std::uintptr_t y, std::uintptr_t alpha, std::uintptr_t bias, int decomposition,
                   int sms, std::uintptr_t workspace, size_t workspace_bytes, std::uintptr_t stream, int tokens) {
        const auto a =
            mixed_args(weight, reordered, m_, n, k, w, scales, x, y, alpha, bias, decomposition, sms, tokens);
        if (b12x::sm90::mixed_workspace_bytes(a) > workspace_bytes)
          throw std::invalid_argument("sm90_mixed_gemm: workspace smaller than sm90_mixed_workspace_bytes");
        check(b12x::sm90::mixed_gemm(a, ptr<void>(workspace), workspace_bytes, stream_of(stream)),
              "sm90_mixed_gemm launch");
      },
      py::arg("weight"), py::arg("reordered"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("w"),
      py::arg("scales"), py::arg("x"), py::arg("y"), py::arg("alpha"), py::arg("bias"), py::arg("decomposition"),
      py::arg("sms"), py::arg("workspace"), py::arg("workspace_bytes"), py::arg("stream"), py::arg("tokens") = 128);
  m.def(
      "sm90_mixed_reorder",
      [](int weight, std::uintptr_t src, std::uintptr_t dst, int n, int k, std::uintptr_t stream) {
        if (!b12x::sm90::mixed_built()) throw std::runtime_error("sm90_mixed: this build holds no sm_90a kernels");
        check(b12x::sm90::mixed_reorder(weight, ptr<const void>(src), ptr<void>(dst), n, k, stream_of(stream)),
              "sm90_mixed_reorder (N and K multiples of 64, distinct buffers)");
      },
      py::arg("weight"), py::arg("src"), py::arg("dst"), py::arg("n"), py::arg("k"), py::arg("stream"));

  // Its grouped form for the fused MoE (csrc/sm90_moe.h): expert-sorted rows, expert offsets in device memory.
  const auto moe_args = [](int weight, int experts, int n, int k, std::uintptr_t w, std::uintptr_t scales,
                           std::uintptr_t x, std::uintptr_t y, bool y_float, std::uintptr_t offsets, int sms) {
    b12x::sm90::MoeGemmArgs a;
    a.weight = weight, a.experts = experts, a.n = n, a.k = k, a.y_float = y_float, a.sms = sms;
    a.w = ptr<const void>(w), a.scales = ptr<const void>(scales), a.x = ptr<const void>(x), a.y = ptr<void>(y);
    a.offsets = ptr<const int>(offsets);
    if (!b12x::sm90::mixed_built()) throw std::runtime_error("sm90_moe: this build holds no sm_90a kernels");
    return a;
  };
  m.def(
      "sm90_moe_workspace_bytes",
      [moe_args](int weight, int experts, int n, int k, bool y_float, int sms) {
        const auto a = moe_args(weight, experts, n, k, 0, 0, 0, 0, y_float, 0, sms);
        if (const char* error = b12x::sm90::moe_shape_error(a))
          throw std::invalid_argument(std::string("sm90_moe: ") + error);
        return b12x::sm90::moe_workspace_bytes(a);
      },
      py::arg("weight"), py::arg("experts"), py::arg("n"), py::arg("k"), py::arg("y_float"), py::arg("sms"));
  m.def(
      "sm90_moe_gemm",
      [moe_args](int weight, int experts, int n, int k, std::uintptr_t w, std::uintptr_t scales, std::uintptr_t x,
                 std::uintptr_t y, bool y_float, std::uintptr_t offsets, int sms, std::uintptr_t workspace,
                 size_t workspace_bytes, std::uintptr_t stream) {
        const auto a = moe_args(weight, experts, n, k, w, scales, x, y, y_float, offsets, sms);
        if (const char* error = b12x::sm90::moe_args_error(a))
          throw std::invalid_argument(std::string("sm90_moe: ") + error);
        if (b12x::sm90::moe_workspace_bytes(a) > workspace_bytes)
          throw std::invalid_argument("sm90_moe_gemm: workspace smaller than sm90_moe_workspace_bytes");
        if (workspace % 128) throw std::invalid_argument("sm90_moe_gemm: the workspace needs 128-byte alignment");
        check(b12x::sm90::moe_gemm(a, ptr<void>(workspace), workspace_bytes, stream_of(stream)), "sm90_moe_gemm launch");
      },
      py::arg("weight"), py::arg("experts"), py::arg("n"), py::arg("k"), py::arg("w"), py::arg("scales"), py::arg("x"),
      py::arg("y"), py::arg("y_float"), py::arg("offsets"), py::arg("sms"), py::arg("workspace"), py::arg("workspace_bytes"),
      py::arg("stream"));

  // The decode-sized GEMM on the CUTLASS family's weight layout (csrc/fragment_mma.h; every arch).
  m.def(
      "fragment_mma_gemm",
      [](int weight, int m_, int n, int k, std::uintptr_t w, std::uintptr_t scales, std::uintptr_t x, std::uintptr_t y,
         std::uintptr_t alpha, std::uintptr_t bias, float scale_mul, float alpha_shift, int tokens, int splits,
         std::uintptr_t partials, size_t partial_floats, std::uintptr_t tickets, int ticket_count,
         std::uintptr_t stream) {
        b12x::fragment::FragmentArgs a;
        a.weight = weight, a.m = m_, a.n = n, a.k = k, a.tokens = tokens, a.splits = splits;
        a.w = ptr<const void>(w), a.scales = ptr<const void>(scales), a.x = ptr<const void>(x), a.y = ptr<void>(y);
        a.alpha = ptr<const float>(alpha), a.bias = ptr<const void>(bias);
        a.scale_mul = scale_mul, a.alpha_shift = alpha_shift;
        a.partials = ptr<float>(partials), a.tickets = ptr<int>(tickets);
        if (const char* error = b12x::fragment::fragment_args_error(a))
          throw std::invalid_argument(std::string("fragment_mma_gemm: ") + error);
        if (partial_floats < b12x::fragment::fragment_partial_floats(m_, n, splits, tokens) ||
            ticket_count < b12x::fragment::fragment_tickets(m_, n, splits, tokens))
          throw std::invalid_argument("fragment_mma_gemm: fewer partials or tickets than the split needs");
        check(b12x::fragment::fragment_gemm(a, stream_of(stream)), "fragment_mma_gemm launch");
      },
      py::arg("weight"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("w"), py::arg("scales"), py::arg("x"),
      py::arg("y"), py::arg("alpha"), py::arg("bias"), py::arg("scale_mul"), py::arg("alpha_shift"), py::arg("tokens"),
      py::arg("splits"), py::arg("partials"), py::arg("partial_floats"), py::arg("tickets"), py::arg("ticket_count"),
      py::arg("stream"));
  m.def("fragment_mma_partial_floats", &b12x::fragment::fragment_partial_floats, py::arg("m"), py::arg("n"),
        py::arg("splits"), py::arg("tokens"));
  m.def("fragment_mma_tickets", &b12x::fragment::fragment_tickets, py::arg("m"), py::arg("n"), py::arg("splits"),
        py::arg("tokens"));

  m.def(
      "embedding_q8_0",
      [](std::uintptr_t table, std::uintptr_t ids, bool ids_int64, std::uintptr_t out, int T, int V, int H,
         std::uintptr_t stream) {
        if (H % b12x::Q8_0_GROUP) throw std::invalid_argument("embedding_q8_0: H must be a multiple of the Q8_0 group");
        check(b12x::embedding_q8_0(ptr<const uint8_t>(table), ptr<const void>(ids), ids_int64,
                                   ptr<__nv_bfloat16>(out), T, V, H, stream_of(stream)),
              "embedding_q8_0 launch");
      },
      py::arg("table"), py::arg("ids"), py::arg("ids_int64"), py::arg("out"), py::arg("T"), py::arg("V"),
      py::arg("H"), py::arg("stream"));
}
