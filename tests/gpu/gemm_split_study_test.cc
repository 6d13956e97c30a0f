// The prefill products' f16 split studied on realistic operands (not parity on random ones, which
// dense_kernels_test.cc and gemm_glue_test.cc check): which of the split forms the Q8_0 and f32
// products need, and DenseGemm's tiled, prepared and exact forms against the f64 product.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/reference/weight_view.h"
#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::Upload;

class GpuDenseGemmStudy : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// Which f16 split the prefill products need, on realistic operands: Q8_0 weights quantized from
// N(0, 0.02) with 0.1% outliers x8 (and f32 ones for the router), activations RMS-normed rows of
// N(0, 1) with four outlier channels x30, times a norm weight in [0.1, 2). Against the f64
// product of the exact (dequantized) weights: one f16 product, hi·hi + hi·lo (the activations'
// correction only: W rounded to f16), hi·hi + lo·hi (the weights' only), and all three terms, each
// with the weights unscaled (the tiled path) and scaled to max |w| ~ 2^14 (the prepared copies);
// then DenseGemm itself: tiled split, prepared split (one and two products) and kExact (f32).
TEST_F(GpuDenseGemmStudy, SplitFormsOnRealisticOperands) {
  std::mt19937 rng(20261201);
  const int64_t cols = 2048, rows = 1024, n = 128;
  for (WeightType type : {WeightType::kQ8_0, WeightType::kF32}) {
    std::vector<float> wf = Random(rng, static_cast<size_t>(rows * cols), 0.02f);
    std::uniform_int_distribution<size_t> pick(0, wf.size() - 1);
    for (size_t i = 0; i < wf.size() / 1000; ++i) wf[pick(rng)] *= 8.0f;
    gpu_testing::TestMatrix w;
    if (type == WeightType::kF32) {
      w = gpu_testing::F32TestMatrix(wf, cols, rows);
    } else {
      w = gpu_testing::TestMatrix{type, cols, rows, *RowBytes(type, cols), {}, {}};
      w.bytes.resize(static_cast<size_t>(w.row_bytes * rows));
      for (int64_t r = 0; r < rows; ++r) QuantizeRow(type, &wf[r * cols], &w.bytes[r * w.row_bytes], cols);
      w.device = Upload(w.bytes);
    }
    std::vector<float> x = Random(rng, static_cast<size_t>(n * cols));
    std::uniform_real_distribution<float> g01(0.1f, 2.0f);
    std::vector<float> norm_w(static_cast<size_t>(cols));
    for (float& g : norm_w) g = g01(rng);
    for (int64_t t = 0; t < n; ++t) {
      float* row = &x[t * cols];
      for (int64_t c : {7, 300, 1111, 2000}) row[c] *= 30.0f;
      double ss = 0.0;
      for (int64_t c = 0; c < cols; ++c) ss += static_cast<double>(row[c]) * row[c];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / cols + 1e-6));
      for (int64_t c = 0; c < cols; ++c) row[c] *= inv * norm_w[c];
    }
    // f64 reference over the exact weights.
    std::vector<float> wd(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) DequantizeMatrixRow(w.view(), r, &wd[r * cols]);
    std::vector<double> ref(static_cast<size_t>(n * rows));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double acc = 0.0;
        for (int64_t c = 0; c < cols; ++c) acc += static_cast<double>(wd[r * cols + c]) * x[t * cols + c];
        ref[t * rows + r] = acc;
      }
    }
    auto err = [&](const std::vector<float>& got) {
      double num = 0.0, den = 0.0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) return static_cast<double>(INFINITY);
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
      }
      return std::sqrt(num / den);
    };
    const std::string tn = type == WeightType::kF32 ? "f32" : "q8_0";
    auto d_x = Upload(x);
    auto d_x16 = gpu_testing::Alloc<uint16_t>(static_cast<size_t>(n * cols * 3));
    TANDEM_ASSERT_CUDA(cuda::LaunchF32ToF16SplitRows(d_x.get(), n, cols, d_x16.get(), nullptr));
    cublasHandle_t handle = nullptr;
    ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
    auto d_w16 = gpu_testing::Alloc<uint16_t>(static_cast<size_t>(rows * cols * 2));  // [hi | lo] rows
    auto d_max = gpu_testing::Alloc<unsigned int>(1);
    ASSERT_EQ(cudaMemset(d_max.get(), 0, 4), cudaSuccess);
    TANDEM_ASSERT_CUDA(cuda::LaunchMaxAbs(w.gpu(), d_max.get(), nullptr));
    unsigned int bits = 0;
    ASSERT_EQ(cudaMemcpy(&bits, d_max.get(), 4, cudaMemcpyDeviceToHost), cudaSuccess);
    float max_abs;
    std::memcpy(&max_abs, &bits, 4);
    float want_max = 0.0f;
    for (float v : wd) want_max = std::max(want_max, std::fabs(v));
    EXPECT_EQ(max_abs, want_max);
    int exponent = 0;
    std::frexp(max_abs, &exponent);
    std::vector<double> split_errors;  // all three terms, unscaled then scaled
    for (bool scaled : {false, true}) {
      const float scale = scaled ? std::ldexp(1.0f, 14 - exponent) : 1.0f, alpha = 1.0f / scale;
      TANDEM_ASSERT_CUDA(cuda::LaunchDequantizeToF16Layout(w.gpu(), 2, scale, d_w16.get(), nullptr));
      // Terms as (weight offset, activation offset) in halves: hi = 0, lo = cols (weights); the
      // split rows' thirds (activations, gemm.cuh).
      const int64_t ah = cuda::kSplitHiThird * cols, al = cuda::kSplitLoThird * cols;
      struct Form {
        const char* name;
        std::vector<std::pair<int64_t, int64_t>> terms;
      };
      const Form forms[] = {{"single", {{0, ah}}},
                            {"hihi_hilo_activation_only", {{0, ah}, {0, al}}},
                            {"hihi_lohi_weight_only", {{0, ah}, {cols, ah}}},
                            {"three_terms", {{0, ah}, {cols, ah}, {0, al}}}};
      for (const Form& f : forms) {
        auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
        for (size_t i = 0; i < f.terms.size(); ++i) {
          const float beta = i == 0 ? 0.0f : 1.0f;
          ASSERT_EQ(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &alpha,
                                 d_w16.get() + f.terms[i].first, CUDA_R_16F, 2 * cols, d_x16.get() + f.terms[i].second,
                                 CUDA_R_16F, 3 * cols, &beta, d_y.get(), CUDA_R_32F, rows, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
                    CUBLAS_STATUS_SUCCESS);
        }
        const double e = gpu_testing::LogError("study_" + tn + "_" + f.name + (scaled ? "_scaled" : "_unscaled"),
                                               err(Download(d_y)));
        if (std::string(f.name) == "three_terms") split_errors.push_back(e);
      }
      if (!scaled) continue;
      // The three terms as one product (K = 3 · cols), in three orders along K: hi·hi first (the
      // prepared split's order until 2026-12-05: weights [hi | lo | hi], activations [hi | hi | lo]),
      // the small terms first (lo·hi, hi·lo, hi·hi; the prepared split now gives hi·lo, lo·hi,
      // hi·hi: gemm.cuh's [lo | hi | hi] rows), and one small term first (lo·hi, hi·hi, hi·lo).
      // Logged only. On an H100 (docs/VALIDATION.md, forty-seventh session) big_first gave 9.9e-6
      // and small_first the three products' 2.0e-6: the small terms lose bits when added into an
      // accumulator that already holds hi·hi; on an H200 every order gave 2.0e-6 (forty-eighth).
      const int64_t xl = cuda::kSplitLoThird * cols, xh = cuda::kSplitHiThird * cols;
      const struct {
        const char* name;
        int64_t w_pieces[3];  // offsets in halves within a [hi | lo] weight row
        int64_t x_pieces[3];  // offsets in halves within a split activation row
      } orders[] = {{"big_first", {0, cols, 0}, {xh, xh, xl}},
                    {"small_first", {cols, 0, 0}, {xh, xl, xh}},
                    {"lo_hi_hi", {cols, 0, 0}, {xh, xh, xl}}};
      auto d_w3 = gpu_testing::Alloc<uint16_t>(static_cast<size_t>(rows * cols * 3));
      auto d_x3 = gpu_testing::Alloc<uint16_t>(static_cast<size_t>(n * cols * 3));
      for (const auto& order : orders) {
        for (int piece = 0; piece < 3; ++piece) {
          ASSERT_EQ(cudaMemcpy2D(d_w3.get() + piece * cols, 3 * cols * 2, d_w16.get() + order.w_pieces[piece],
                                 2 * cols * 2, cols * 2, rows, cudaMemcpyDeviceToDevice),
                    cudaSuccess);
          ASSERT_EQ(cudaMemcpy2D(d_x3.get() + piece * cols, 3 * cols * 2, d_x16.get() + order.x_pieces[piece],
                                 3 * cols * 2, cols * 2, n, cudaMemcpyDeviceToDevice),
                    cudaSuccess);
        }
        // y = (or +=, with beta 1) the pieces' first k halves of d_w3 and d_x3 from `from` on.
        auto product = [&](int64_t from, int64_t k, float beta, float* y) {
          return cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, k, &alpha, d_w3.get() + from, CUDA_R_16F,
                              3 * cols, d_x3.get() + from, CUDA_R_16F, 3 * cols, &beta, y, CUDA_R_32F, rows,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        };
        auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
        ASSERT_EQ(product(0, 3 * cols, 0.0f, d_y.get()), CUBLAS_STATUS_SUCCESS);
        gpu_testing::LogError("study_" + tn + "_one_product_" + order.name, err(Download(d_y)));
        if (std::string(order.name) != "small_first") continue;
        // The same pieces as two products: the small terms (K = 2 · cols) into a fresh accumulator,
        // then hi·hi onto them through beta = 1 (cuBLAS adds C in f32 after the product).
        auto d_y2 = Poisoned<float>(static_cast<size_t>(n * rows));
        ASSERT_EQ(product(0, 2 * cols, 0.0f, d_y2.get()), CUBLAS_STATUS_SUCCESS);
        ASSERT_EQ(product(2 * cols, cols, 1.0f, d_y2.get()), CUBLAS_STATUS_SUCCESS);
        gpu_testing::LogError("study_" + tn + "_two_products_small_first", err(Download(d_y2)));
      }
    }
    cublasDestroy(handle);
    // DenseGemm's own paths on the same operands.
    auto options = [&](cuda::GemmMode mode) {
      cuda::DenseGemmOptions o;
      o.mode = mode;
      o.max_n = n;
      o.max_cols = cols;
      o.tile_bytes = rows * cols * 4;
      o.workspace_bytes = 4 << 20;
      return o;
    };
    double tiled = 0.0;
    for (int form = 0; form < 4; ++form) {
      cuda::DenseGemmOptions o = options(form == 3 ? cuda::GemmMode::kExact : cuda::GemmMode::kFastSplit);
      o.split_one_product = form != 2;
      auto g = cuda::DenseGemm::Create(o);
      ASSERT_TRUE(g.ok()) << g.status();
      if (form == 1 || form == 2) {
        ASSERT_TRUE((*g)->Prepare(w.gpu()).ok());
      }
      auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
      ASSERT_TRUE((*g)->Run(w.gpu(), d_x.get(), n, d_y.get(), nullptr).ok());
      const char* names[] = {"tiled_split", "prepared_split_one", "prepared_split_two", "exact_f32"};
      const double e = gpu_testing::LogError("study_" + tn + "_densegemm_" + names[form], err(Download(d_y)));
      if (form == 0) tiled = e;
      if (form == 1 || form == 2) {
        // The prepared split is at least as accurate as the tiled one (it scales the weights).
        EXPECT_LE(e, 2.0 * tiled + 1e-8) << names[form];
        EXPECT_LE(e, 1e-5) << names[form];
      }
    }
    // The prepared one-product split through each cuBLAS route (GemmAlgo), logged only: its error
    // depends on the kernel cuBLAS picks for K = 3 · cols on the card (9.9e-6 on an H100 where the
    // H200 gave at most twice the tiled split's; docs/VALIDATION.md, forty-sixth session), and these
    // lines say which route does it.
    const std::pair<cuda::GemmAlgo, const char*> algos[] = {
        {cuda::GemmAlgo::kGemmEx, "gemmex"}, {cuda::GemmAlgo::kLt, "lt"}, {cuda::GemmAlgo::kLtNoSplitK, "lt_nosplitk"}};
    for (const auto& [algo, algo_name] : algos) {
      cuda::DenseGemmOptions o = options(cuda::GemmMode::kFastSplit);
      o.prepared_algo = algo;
      auto g = cuda::DenseGemm::Create(o);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_TRUE((*g)->Prepare(w.gpu()).ok());
      auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
      ASSERT_TRUE((*g)->Run(w.gpu(), d_x.get(), n, d_y.get(), nullptr).ok());
      gpu_testing::LogError(std::string("study_") + tn + "_densegemm_prepared_split_one_" + algo_name,
                            err(Download(d_y)));
    }
    // Sanity of the study itself: the scaled three-term form matches DenseGemm's prepared one.
    ASSERT_EQ(split_errors.size(), 2u);
    EXPECT_LE(split_errors[1], 1e-5);
  }
}

}  // namespace
}  // namespace tandem
