// b12x_kernels._C: a narrow binding over device pointers, sizes and a stream (no libtorch), so one binary
// serves any torch version. Host-side checks here are the cheap ones; b12x_core validates shapes and dtypes.
#include <pybind11/pybind11.h>

#include <map>
#include <stdexcept>
#include <string>

#include "kernels.h"

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

  m.def(
      "gemv_ggml",
      [](int format, std::uintptr_t w, std::uintptr_t grid, std::uintptr_t x, std::uintptr_t bias, std::uintptr_t y,
         int M, int max_m, int N, int K, std::uintptr_t stream) {
        check_tokens("gemv_ggml", M, max_m);
        int group = 0;
        switch (format) {
          case b12x::FMT_Q8_0: group = b12x::Q8_0_GROUP; break;
          case b12x::FMT_IQ2_XXS: group = b12x::IQ2_XXS_GROUP; break;
          case b12x::FMT_IQ2_XS: group = b12x::IQ2_XS_GROUP; break;
          default: throw std::invalid_argument("gemv_ggml: format " + std::to_string(format) + " is no GGML format");
        }
        if (K % group) throw std::invalid_argument("gemv_ggml: K must be a multiple of the block size");
        if (!w || !x || !y || (format != b12x::FMT_Q8_0 && !grid))
          throw std::invalid_argument("gemv_ggml: null pointer");
        check(b12x::gemv_ggml(format, ptr<const uint8_t>(w), ptr<const uint64_t>(grid),
                              ptr<const __nv_bfloat16>(x), ptr<const __nv_bfloat16>(bias), ptr<__nv_bfloat16>(y), M,
                              max_m, N, K, reinterpret_cast<cudaStream_t>(stream)),
              "gemv_ggml launch");
      },
      py::arg("format"), py::arg("w"), py::arg("grid"), py::arg("x"), py::arg("bias"), py::arg("y"), py::arg("M"),
      py::arg("max_m"), py::arg("N"), py::arg("K"), py::arg("stream"));

  m.def(
      "gemv_elem",
      [](int format, std::uintptr_t w, std::uintptr_t scales, float tensor_scale, std::uintptr_t x,
         std::uintptr_t x_scale, int x_scale_cols, std::uintptr_t bias, std::uintptr_t y, int ldy, int M, int max_m,
         int N, int K, std::uintptr_t stream) {
        check_tokens("gemv_elem", M, max_m);
        if (K % 8) throw std::invalid_argument("gemv_elem: K must be a multiple of 8");
        if (!w || !x || !y || (format != b12x::FMT_FP8 && !scales))
          throw std::invalid_argument("gemv_elem: null pointer");
        const int groups = (K + b12x::FP8_BLOCK_SIZE - 1) / b12x::FP8_BLOCK_SIZE;
        if (x_scale && x_scale_cols != 1 && x_scale_cols != groups)
          throw std::invalid_argument("gemv_elem: x_scale_cols must be 1 or ceil(K/128)");
        check(b12x::gemv_elem(format, ptr<const uint8_t>(w), ptr<const uint8_t>(scales), tensor_scale,
                              ptr<const __nv_bfloat16>(x), ptr<const float>(x_scale), x_scale_cols,
                              ptr<const __nv_bfloat16>(bias), ptr<__nv_bfloat16>(y), ldy, M, max_m, N, K,
                              reinterpret_cast<cudaStream_t>(stream)),
              "gemv_elem launch");
      },
      py::arg("format"), py::arg("w"), py::arg("scales"), py::arg("tensor_scale"), py::arg("x"), py::arg("x_scale"),
      py::arg("x_scale_cols"), py::arg("bias"), py::arg("y"), py::arg("ldy"), py::arg("M"), py::arg("max_m"),
      py::arg("N"), py::arg("K"), py::arg("stream"));

  m.def("mma_chunk_k", &b12x::mma_chunk_k, py::arg("format"));
  m.def("mma_blocks_per_sm", &b12x::mma_blocks_per_sm, py::arg("format"), py::arg("mt"), py::arg("rt"));

  m.def(
      "mma_gemm",
      [](int format, std::uintptr_t codes, std::uintptr_t meta, std::uintptr_t meta2, std::uintptr_t block_scale,
         std::uintptr_t tables, float alpha, float scale_mul, std::uintptr_t x, std::uintptr_t bias, std::uintptr_t y,
         int ldy, int M, int N, int K, int chunks, int mt, int rt, int splits, std::uintptr_t partials,
         std::uintptr_t tickets, std::uintptr_t stream, const std::string& epilogue, std::uintptr_t row_scale,
         std::uintptr_t order, std::uintptr_t block_expert, std::uintptr_t block_start, std::uintptr_t block_rows,
         int blocks, int top_k) {
        static const std::map<std::string, int> epilogues = {
            {"bf16", b12x::MMA_OUT_BF16}, {"silu", b12x::MMA_OUT_SILU}, {"relu2", b12x::MMA_OUT_RELU2},
            {"f32", b12x::MMA_OUT_F32}};
        const auto out = epilogues.find(epilogue);
        if (out == epilogues.end()) throw std::invalid_argument("mma_gemm: unknown epilogue " + epilogue);
        const int ck = b12x::mma_chunk_k(format);
        if (!ck) throw std::invalid_argument("mma_gemm: unknown format " + std::to_string(format));
        if (M < 1 || N < 1 || K < 8 || K % 8) throw std::invalid_argument("mma_gemm: need M, N >= 1 and K % 8 == 0");
        if (chunks * ck < K) throw std::invalid_argument("mma_gemm: the repacked weight covers fewer than K columns");
        if (mt != 1 && mt != 2 && mt != 4) throw std::invalid_argument("mma_gemm: mt must be 1, 2 or 4");
        if (rt != 1 && rt != 2) throw std::invalid_argument("mma_gemm: rt must be 1 or 2");
        if (splits < 1 || splits > chunks) throw std::invalid_argument("mma_gemm: splits must be in 1..chunks");
        const bool f32 = out->second == b12x::MMA_OUT_F32;
        if ((splits > 1 || f32) && !partials) throw std::invalid_argument("mma_gemm: split K or f32 needs partials");
        if (splits > 1 && !f32 && !tickets) throw std::invalid_argument("mma_gemm: split K needs tickets");
        if (!codes || !x || (!y && !f32) || (codes | x) % 16)
          throw std::invalid_argument("mma_gemm: null or misaligned pointer");
        if (out->second == b12x::MMA_OUT_SILU && N % 16)
          throw std::invalid_argument("mma_gemm: silu needs N % 16 == 0 (8 gate, 8 up rows per tile)");
        if (order && (!block_expert || !block_start || !block_rows || blocks < 1 || N % 16))
          throw std::invalid_argument("mma_gemm: grouped needs the block table, blocks >= 1 and N % 16 == 0");
        b12x::MmaArgs a{};
        a.format = format;
        a.codes = ptr<const uint8_t>(codes);
        a.meta = ptr<const uint8_t>(meta);
        a.meta2 = ptr<const uint8_t>(meta2);
        a.block_scale = ptr<const float>(block_scale);
        a.tables = ptr<const uint32_t>(tables);
        a.alpha = alpha;
        a.scale_mul = scale_mul;
        a.row_scale = ptr<const float>(row_scale);
        a.x = ptr<const __nv_bfloat16>(x);
        a.bias = ptr<const __nv_bfloat16>(bias);
        a.y = ptr<__nv_bfloat16>(y);
        a.ldy = ldy;
        a.M = M;
        a.N = N;
        a.K = K;
        a.chunks = chunks;
        a.mt = mt;
        a.rt = rt;
        a.splits = splits;
        a.partials = ptr<float>(partials);
        a.tickets = ptr<int>(tickets);
        a.epilogue = out->second;
        a.order = ptr<const int>(order);
        a.block_expert = ptr<const int>(block_expert);
        a.block_start = ptr<const int>(block_start);
        a.block_rows = ptr<const int>(block_rows);
        a.blocks = blocks;
        a.top_k = top_k;
        check(b12x::mma_gemm(a, reinterpret_cast<cudaStream_t>(stream)), "mma_gemm launch");
      },
      py::arg("format"), py::arg("codes"), py::arg("meta"), py::arg("meta2"), py::arg("block_scale"),
      py::arg("tables"), py::arg("alpha"), py::arg("scale_mul"), py::arg("x"), py::arg("bias"), py::arg("y"),
      py::arg("ldy"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("chunks"), py::arg("mt"), py::arg("rt"),
      py::arg("splits"), py::arg("partials"), py::arg("tickets"), py::arg("stream"), py::arg("epilogue") = "bf16",
      py::arg("row_scale") = 0, py::arg("order") = 0, py::arg("block_expert") = 0, py::arg("block_start") = 0,
      py::arg("block_rows") = 0, py::arg("blocks") = 0, py::arg("top_k") = 0);

  m.def(
      "embedding_q8_0",
      [](std::uintptr_t table, std::uintptr_t ids, bool ids_int64, std::uintptr_t out, int T, int V, int H,
         std::uintptr_t stream) {
        if (H % b12x::Q8_0_GROUP) throw std::invalid_argument("embedding_q8_0: H must be a multiple of the Q8_0 group");
        check(b12x::embedding_q8_0(ptr<const uint8_t>(table), ptr<const void>(ids), ids_int64,
                                   ptr<__nv_bfloat16>(out), T, V, H, reinterpret_cast<cudaStream_t>(stream)),
              "embedding_q8_0 launch");
      },
      py::arg("table"), py::arg("ids"), py::arg("ids_int64"), py::arg("out"), py::arg("T"), py::arg("V"),
      py::arg("H"), py::arg("stream"));
}
