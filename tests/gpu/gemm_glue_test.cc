// The prefill glue around the dense products: the cuBLAS paths of the prepared products
// (GemmAlgo: cublasGemmEx, cublasLt's first algorithm, cublasLt without split-K) against each other
// and the CPU reference, the converted-input record (DenseGemm::SetConverted) that lets the stream norm write a product's f16
// input rows itself (LaunchInjectRmsNormF16) bit for bit as the old norm-then-convert path, and the
// SiLU-times-up rows written as the next product's f16 input (LaunchSiluMulToF16Rows).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/reference/matmul.h"
#include "common/reference/weight_view.h"
#include "common/weights/half.h"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using cuda::GemmAlgo;
using cuda::GemmMode;
using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RandomMatrix;
using gpu_testing::RelL2;
using gpu_testing::Upload;

class GpuGemmGlueTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// split_f8: the F8 form for every matrix of any size (f8_min_weights 0) unless told otherwise.
// f8_terms: both halves of the fp8 correction unless told otherwise (not TANDEM_GEMM_F8_TERMS's
// default: the tolerances below are the two-term form's).
std::unique_ptr<cuda::DenseGemm> MakeGemm(GemmMode mode, GemmAlgo algo, int64_t max_n, int64_t max_cols,
                                          bool one_product = true, bool split_f8 = false, int64_t f8_min_weights = 0,
                                          cuda::F8Terms f8_terms = cuda::F8Terms::kBoth) {
  cuda::DenseGemmOptions o;
  o.mode = mode;
  o.max_n = max_n;
  o.max_cols = max_cols;
  o.tile_bytes = 64ll << 20;
  o.workspace_bytes = 32ll << 20;
  o.split_one_product = one_product;
  o.prepared_algo = algo;
  o.split_f8 = split_f8;  // not TANDEM_GEMM_SPLIT_F8's default: each test says which it measures
  o.split_f8_min_weights = f8_min_weights;
  o.f8_terms = f8_terms;
  auto g = cuda::DenseGemm::Create(o);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : nullptr;
}

// Prepared products through the three cuBLAS paths: within f32 rounding of each other (the same
// f16 operands and f32 accumulation, only the order of the sums differs) and of the CPU reference
// (the tolerances of the prepared products elsewhere: 2e-5 split, 1e-2 one f16 product). Shapes
// of the 512-token prefill that may take split-K (few output rows, long K): 64 rows (the GDN ba
// product), 512 rows (the router), a narrow one (alignment), and both split layouts ([hi | lo | hi] one product, [hi | lo]
// two with beta 1 for the second).
TEST_F(GpuGemmGlueTest, PreparedProductsAgreeAcrossCublasPaths) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  // (rows, cols): 96 columns put the lo third of split rows and the second product's B pointer
  // off 256-byte boundaries (the cuBLASLt plans ask for the real alignment).
  const std::pair<int64_t, int64_t> shapes[] = {{64, 2048}, {512, 2048}, {40, 96}};
  for (const auto& [rows, cols] : shapes) {
    const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, cols, rows, 0.02f);
    const cuda::DeviceMatrix m = w.gpu();
    for (int64_t n : {512, 45}) {
      const std::vector<float> x = Random(rng, static_cast<size_t>(n * cols));
      auto d_x = Upload(x);
      std::vector<float> want(static_cast<size_t>(n * rows));
      MatMul(w.view(), x.data(), n, want.data(), nullptr);
      for (GemmMode mode : {GemmMode::kFastSplit, GemmMode::kFast}) {
        for (bool one_product : {true, false}) {
          if (mode == GemmMode::kFast && !one_product) continue;
          std::vector<float> base;
          for (GemmAlgo algo : {GemmAlgo::kGemmEx, GemmAlgo::kLt, GemmAlgo::kLtNoSplitK}) {
            std::unique_ptr<cuda::DenseGemm> g = MakeGemm(mode, algo, 512, 2048, one_product);
            ASSERT_NE(g, nullptr);
            ASSERT_TRUE(g->Prepare(m, mode).ok());
            auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
            const absl::Status s = g->Run(m, d_x.get(), n, d_y.get(), nullptr, mode);
            ASSERT_TRUE(s.ok()) << s;
            const std::vector<float> y = Download(d_y);
            const std::string tag = std::string("gemm_algo") + std::to_string(static_cast<int>(algo)) + "_rows" +
                                    std::to_string(rows) + "_cols" + std::to_string(cols) + "_n" + std::to_string(n) +
                                    (mode == GemmMode::kFast ? "_fast" : one_product ? "_split3" : "_split2");
            EXPECT_LE(gpu_testing::LogError(tag, RelL2(y, want)), mode == GemmMode::kFast ? 1e-2 : 2e-5) << tag;
            if (algo == GemmAlgo::kGemmEx) {
              base = y;
            } else {
              EXPECT_LE(gpu_testing::LogError(tag + "_vs_gemmex", RelL2(y, base)), 1e-5) << tag;
            }
          }
        }
      }
    }
  }
}

// SetConverted: ConvertInput of the recorded (x, n, cols, mode) launches nothing (the scratch keeps
// what was written there), anything else converts again and drops the record, input_scratch()
// and ForgetConverted drop it; and a Run over a recorded x reads the rows as they are.
TEST_F(GpuGemmGlueTest, ConvertedRecordIsUsedOnlyForItsInput) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t cols = 512, rows = 96, n = 40;
  const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, cols, rows, 0.02f);
  const cuda::DeviceMatrix m = w.gpu();
  auto d_x = Upload(Random(rng, static_cast<size_t>(n * cols)));
  std::unique_ptr<cuda::DenseGemm> g = MakeGemm(GemmMode::kFastSplit, GemmAlgo::kGemmEx, 64, cols);
  ASSERT_NE(g, nullptr);
  ASSERT_TRUE(g->Prepare(m, GemmMode::kFastSplit).ok());
  const size_t count = static_cast<size_t>(n * 3 * cols);
  // The real conversion, kept aside.
  absl::StatusOr<cuda::DenseGemm::F16Input> in = g->ConvertInput(d_x.get(), n, cols, GemmMode::kFastSplit, nullptr);
  ASSERT_TRUE(in.ok()) << in.status();
  std::vector<uint16_t> rows16(count);
  ASSERT_EQ(cudaMemcpy(rows16.data(), in->data, count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_FALSE(g->HoldsConverted(d_x.get(), n, cols, GemmMode::kFastSplit));  // ConvertInput records nothing
  auto d_want = Poisoned<float>(static_cast<size_t>(n * rows));
  ASSERT_TRUE(g->Run(m, d_x.get(), n, d_want.get(), nullptr, GemmMode::kFastSplit).ok());
  const std::vector<float> want = Download(d_want);

  // A record that lies (zeros in the scratch): ConvertInput must not touch the scratch.
  ASSERT_EQ(cudaMemset(g->input_scratch(), 0, count * 2), cudaSuccess);
  g->SetConverted(d_x.get(), n, cols, GemmMode::kFastSplit);
  EXPECT_TRUE(g->HoldsConverted(d_x.get(), n, cols, GemmMode::kFastSplit));
  in = g->ConvertInput(d_x.get(), n, cols, GemmMode::kFastSplit, nullptr);
  ASSERT_TRUE(in.ok());
  std::vector<uint16_t> now(count, 1);
  ASSERT_EQ(cudaMemcpy(now.data(), in->data, count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(now, std::vector<uint16_t>(count, 0)) << "ConvertInput converted over a recorded input";
  // Another n, mode or pointer converts and drops the record.
  EXPECT_FALSE(g->HoldsConverted(d_x.get(), n - 1, cols, GemmMode::kFastSplit));
  EXPECT_FALSE(g->HoldsConverted(d_x.get(), n, cols, GemmMode::kFast));
  ASSERT_TRUE(g->ConvertInput(d_x.get(), n - 1, cols, GemmMode::kFastSplit, nullptr).ok());
  EXPECT_FALSE(g->HoldsConverted(d_x.get(), n, cols, GemmMode::kFastSplit));
  g->SetConverted(d_x.get(), n, cols, GemmMode::kFastSplit);
  (void)g->input_scratch();
  EXPECT_FALSE(g->HoldsConverted(d_x.get(), n, cols, GemmMode::kFastSplit));
  g->SetConverted(d_x.get(), n, cols, GemmMode::kFastSplit);
  g->ForgetConverted();
  EXPECT_FALSE(g->HoldsConverted(d_x.get(), n, cols, GemmMode::kFastSplit));

  // The true rows recorded: a Run reads them as they are and gives the same bits as converting.
  ASSERT_EQ(cudaMemcpy(g->input_scratch(), rows16.data(), count * 2, cudaMemcpyHostToDevice), cudaSuccess);
  g->SetConverted(d_x.get(), n, cols, GemmMode::kFastSplit);
  auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
  ASSERT_TRUE(g->Run(m, d_x.get(), n, d_y.get(), nullptr, GemmMode::kFastSplit).ok());
  EXPECT_EQ(Download(d_y), want);
  EXPECT_TRUE(g->HoldsConverted(d_x.get(), n, cols, GemmMode::kFastSplit));  // a prepared Run keeps it
  // An unprepared matrix (tiled path) rewrites the scratch: the record goes.
  const gpu_testing::TestMatrix other = RandomMatrix(rng, WeightType::kQ8_0, cols, 16, 0.02f);
  auto d_o = Poisoned<float>(static_cast<size_t>(n * 16));
  ASSERT_TRUE(g->Run(other.gpu(), d_x.get(), n, d_o.get(), nullptr, GemmMode::kFastSplit).ok());
  EXPECT_FALSE(g->HoldsConverted(d_x.get(), n, cols, GemmMode::kFastSplit));
}

// Activations like a normed row with outliers: N(0, 1), every 97th column 8x, a few 40x.
std::vector<float> OutlierActivations(std::mt19937& rng, int64_t n, int64_t cols) {
  std::vector<float> x = Random(rng, static_cast<size_t>(n * cols));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < cols; c += 97) x[t * cols + c] *= 8.0f;
  }
  for (size_t i = 7; i < x.size(); i += 4099) x[i] *= 40.0f;
  return x;
}

// y = x · Wᵀ in f64 over the dequantized weights.
std::vector<double> ProductF64(const gpu_testing::TestMatrix& w, const std::vector<float>& x, int64_t n) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  std::vector<double> y(static_cast<size_t>(n * w.rows));
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeMatrixRow(w.view(), r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      double s = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) s += static_cast<double>(x[t * w.cols + c]) * row[c];
      y[t * w.rows + r] = s;
    }
  }
  return y;
}

double RelL2F64(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

// TANDEM_GEMM_SPLIT_F8 (DenseGemmOptions::split_f8): one f16 product plus one fp8 correction
// product against an f64 reference within 3e-5 relative L2 (the prototype's 1.0e-5; the three f16
// products' 1.3e-6 and one f16 product's ~3e-4 are logged beside it; for a few outputs, a fifth of
// one f16 product's error, see below), on Q8_0 weights and
// activations with outliers: single matrices of even, odd (1, 40: padded fp8 output) and narrow
// (96 columns) shapes, odd and even token counts, cublasGemmEx and cublasLt for the f16 half; a
// copy of 4 bytes per weight (+16 zero rows, the scale).
TEST_F(GpuGemmGlueTest, SplitF8ProductMatchesF64Reference) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const std::pair<int64_t, int64_t> shapes[] = {{64, 2048}, {520, 512}, {40, 96}, {1, 512}};
  for (const auto& [rows, cols] : shapes) {
    const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, cols, rows, 0.02f);
    const cuda::DeviceMatrix m = w.gpu();
    for (int64_t n : {45, 512, 3}) {
      const std::vector<float> x = OutlierActivations(rng, n, cols);
      auto d_x = Upload(x);
      const std::vector<double> want = ProductF64(w, x, n);
      const std::string tag = "f8_rows" + std::to_string(rows) + "_cols" + std::to_string(cols) + "_n" +
                              std::to_string(n);
      double old_err = 0.0, one_err = 0.0;
      {
        std::unique_ptr<cuda::DenseGemm> g = MakeGemm(GemmMode::kFastSplit, GemmAlgo::kGemmEx, 512, 2048);
        ASSERT_NE(g, nullptr);
        ASSERT_TRUE(g->Prepare(m, GemmMode::kFastSplit).ok());
        auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
        ASSERT_TRUE(g->Run(m, d_x.get(), n, d_y.get(), nullptr, GemmMode::kFastSplit).ok());
        old_err = gpu_testing::LogError(tag + "_split3", RelL2F64(Download(d_y), want));
        ASSERT_TRUE(g->Run(m, d_x.get(), n, d_y.get(), nullptr, GemmMode::kFast).ok());
        one_err = gpu_testing::LogError(tag + "_one_f16", RelL2F64(Download(d_y), want));
      }
      for (GemmAlgo algo : {GemmAlgo::kGemmEx, GemmAlgo::kLt}) {
        std::unique_ptr<cuda::DenseGemm> g = MakeGemm(GemmMode::kFastSplit, algo, 512, 2048, true, /*split_f8=*/true);
        ASSERT_NE(g, nullptr);
        ASSERT_TRUE(g->split_f8());
        ASSERT_TRUE(g->Prepare(m, GemmMode::kFastSplit).ok());
        EXPECT_TRUE(g->IsPrepared(m, GemmMode::kFastSplit));
        EXPECT_TRUE(g->IsPrepared(m, GemmMode::kFast));  // the hi rows serve kFast
        EXPECT_EQ(g->prepared_bytes(), (rows + 16) * cols * 4 + 256);
        auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
        const absl::Status s = g->Run(m, d_x.get(), n, d_y.get(), nullptr, GemmMode::kFastSplit);
        ASSERT_TRUE(s.ok()) << s;
        const std::vector<float> y = Download(d_y);
        const double err = gpu_testing::LogError(tag + "_f8_algo" + std::to_string(static_cast<int>(algo)),
                                                 RelL2F64(y, want));
        // 3e-5, or a fifth of one f16 product's error on the same inputs where that is larger: over
        // a few outputs (1 row x 3 tokens) the relative L2 is one output's relative error, which a
        // sum near cancellation magnifies for both forms alike (H200, 2026-12-01, random inputs:
        // 3.4e-5 against one f16 product's 8.9e-4 there, ~1e-5 against ~3e-4 elsewhere).
        EXPECT_LE(err, std::max(3e-5, 0.2 * one_err))
            << tag << " (three f16 products: " << old_err << ", one f16 product: " << one_err << ")";
        // kFast over the same copy: one f16 product.
        auto d_f = Poisoned<float>(static_cast<size_t>(n * rows));
        ASSERT_TRUE(g->Run(m, d_x.get(), n, d_f.get(), nullptr, GemmMode::kFast).ok());
        EXPECT_LE(RelL2F64(Download(d_f), want), 1e-2) << tag;
        // The split rows a fused writer leaves in the scratch (LaunchF32ToF16SplitRows: the same
        // layout and roundings as ConvertInput), their fp8 rows derived by the product: the same bits.
        TANDEM_ASSERT_CUDA(cuda::LaunchF32ToF16SplitRows(d_x.get(), n, cols, g->input_scratch(), nullptr));
        auto d_r = Poisoned<float>(static_cast<size_t>(n * rows));
        const cuda::DenseGemm::F16Input rows_in{g->input_scratch(), n, cols, GemmMode::kFastSplit};
        ASSERT_TRUE(g->RunInput(m, rows_in, d_r.get(), nullptr).ok());
        EXPECT_EQ(Download(d_r), y) << tag << ": rows written into the scratch differ from converted ones";
        // Again over the same rows (the fp8 rows reused).
        ASSERT_TRUE(g->RunInput(m, rows_in, d_r.get(), nullptr).ok());
        EXPECT_EQ(Download(d_r), y) << tag << ": a second product over the same rows";
        // Recorded rows (SetConverted, the stream norm's path): the same.
        TANDEM_ASSERT_CUDA(cuda::LaunchF32ToF16SplitRows(d_x.get(), n, cols, g->input_scratch(), nullptr));
        g->SetConverted(d_x.get(), n, cols, GemmMode::kFastSplit);
        ASSERT_TRUE(g->Run(m, d_x.get(), n, d_r.get(), nullptr, GemmMode::kFastSplit).ok());
        EXPECT_EQ(Download(d_r), y) << tag << ": recorded rows";
      }
      // One correction term (DenseGemmOptions::f8_terms, TANDEM_GEMM_F8_TERMS): one rounding of
      // the two left uncorrected, so of one f16 product's order: within 2x of its error wherever
      // enough outputs average the near-cancelling sums away (1x failed once on an H100, 2026-12-06,
      // seed 601106210: 40 rows x 3 tokens over 96 columns, one term 2.80e-4 against 2.66e-4: two
      // errors of the same order, either may be the larger), within 4x of it for the few-output
      // cases (see above: 2x failed once on the H200, 2026-12-03, seed 3512268604: 1 row x 3 tokens,
      // one term 3.37e-4 against one f16 product's 1.25e-4). A wrong pairing of the halves (e.g.
      // hi8·hi8 added) is off by the product's own order, thousands of times that.
      for (cuda::F8Terms terms : {cuda::F8Terms::kActivationLo, cuda::F8Terms::kWeightLo}) {
        std::unique_ptr<cuda::DenseGemm> g =
            MakeGemm(GemmMode::kFastSplit, GemmAlgo::kGemmEx, 512, 2048, true, /*split_f8=*/true, 0, terms);
        ASSERT_NE(g, nullptr);
        ASSERT_TRUE(g->Prepare(m, GemmMode::kFastSplit).ok());
        auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
        const absl::Status s = g->Run(m, d_x.get(), n, d_y.get(), nullptr, GemmMode::kFastSplit);
        ASSERT_TRUE(s.ok()) << s;
        const double err = gpu_testing::LogError(
            tag + (terms == cuda::F8Terms::kActivationLo ? "_f8_xlo" : "_f8_wlo"), RelL2F64(Download(d_y), want));
        EXPECT_LE(err, (rows * n >= 64 ? 2 : 4) * one_err)
            << tag << " one term " << static_cast<int>(terms) << " (two-term bound 3e-5, one f16 product " << one_err
            << ")";
      }
    }
  }
}

// F8 stacks (PrepareStack in a split_f8 plan): one copy for three parts of different scales and
// rows (one part of 1 row: its own products take the padded fp8 output), RunStack and each part's
// RunInput against the f64 reference within 3e-5, zero padding columns; the F8 product refuses
// split rows outside the scratch; a smaller input right after keeps the accuracy (its own max);
// zero activations give zeros (the scale of a zero maximum).
TEST_F(GpuGemmGlueTest, SplitF8StackMatchesF64Reference) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t cols = 512, n = 45;
  const int64_t part_rows[3] = {200, 136, 1};
  const float stddev[3] = {0.05f, 0.02f, 0.3f};
  std::vector<gpu_testing::TestMatrix> w;
  for (int i = 0; i < 3; ++i) w.push_back(RandomMatrix(rng, WeightType::kQ8_0, cols, part_rows[i], stddev[i]));
  const cuda::DeviceMatrix m[3] = {w[0].gpu(), w[1].gpu(), w[2].gpu()};
  const cuda::DeviceMatrix* parts[3] = {&m[0], &m[1], &m[2]};
  const std::vector<float> x = OutlierActivations(rng, n, cols);
  auto d_x = Upload(x);
  std::unique_ptr<cuda::DenseGemm> g = MakeGemm(GemmMode::kFastSplit, GemmAlgo::kGemmEx, 64, cols, true, true);
  ASSERT_NE(g, nullptr);
  absl::StatusOr<int64_t> stack_rows = g->PrepareStack(parts, GemmMode::kFastSplit);
  ASSERT_TRUE(stack_rows.ok()) << stack_rows.status();
  const int64_t R = *stack_rows;
  EXPECT_EQ(R, 344);
  EXPECT_EQ(g->prepared_bytes(), (R + 16) * cols * 4 + 256);
  absl::StatusOr<cuda::DenseGemm::F16Input> in = g->ConvertInput(d_x.get(), n, cols, GemmMode::kFastSplit, nullptr);
  ASSERT_TRUE(in.ok()) << in.status();
  auto d_y = Poisoned<float>(static_cast<size_t>(n * R));
  ASSERT_TRUE(g->RunStack(parts, *in, d_y.get(), nullptr).ok());
  const std::vector<float> y = Download(d_y);
  int64_t col = 0;
  for (int i = 0; i < 3; ++i) {
    const std::vector<double> want = ProductF64(w[i], x, n);
    std::vector<float> got(static_cast<size_t>(n * part_rows[i]));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < part_rows[i]; ++r) got[t * part_rows[i] + r] = y[t * R + col + r];
    }
    const std::string name = "f8_stack_part" + std::to_string(i);
    EXPECT_LE(gpu_testing::LogError(name, RelL2F64(got, want)), 3e-5) << name;
    auto d_part = Poisoned<float>(static_cast<size_t>(n * part_rows[i]));
    const absl::Status s = g->RunInput(m[i], *in, d_part.get(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_LE(gpu_testing::LogError(name + "_alone", RelL2F64(Download(d_part), want)), 3e-5) << name;
    col += part_rows[i];
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = col; r < R; ++r) ASSERT_EQ(y[t * R + r], 0.0f) << "padding column " << r;
  }
  // Split rows outside the scratch: refused, not written.
  auto d_rows = Poisoned<uint16_t>(static_cast<size_t>(n * 3 * cols));
  EXPECT_EQ(g->RunInput(m[0], cuda::DenseGemm::F16Input{d_rows.get(), n, cols, GemmMode::kFastSplit}, d_y.get(), nullptr)
                .code(),
            absl::StatusCode::kFailedPrecondition);
  // Each conversion measures its own max |x| (the device max is reset after use): x · 2^-8 right
  // after x keeps the accuracy (a stale max would push its fp8 values below e4m3's smallest
  // subnormal; 2^-8 keeps the f16 halves themselves clear of f16's subnormals).
  {
    std::vector<float> small = x;
    for (float& v : small) v = std::ldexp(v, -8);
    auto d_small = Upload(small);
    std::vector<double> want = ProductF64(w[0], x, n);
    for (double& v : want) v = std::ldexp(v, -8);
    auto d_s = Poisoned<float>(static_cast<size_t>(n * part_rows[0]));
    ASSERT_TRUE(g->Run(m[0], d_small.get(), n, d_s.get(), nullptr, GemmMode::kFastSplit).ok());
    EXPECT_LE(gpu_testing::LogError("f8_stack_part0_scaled_down", RelL2F64(Download(d_s), want)), 3e-5);
  }
  // Zero activations: zeros, no NaN from the scale.
  auto d_zero = Upload(std::vector<float>(static_cast<size_t>(n * cols), 0.0f));
  ASSERT_TRUE(g->Run(m[0], d_zero.get(), n, d_y.get(), nullptr, GemmMode::kFastSplit).ok());
  const std::vector<float> z = Download(d_y);
  for (int64_t i = 0; i < n * part_rows[0]; ++i) ASSERT_EQ(z[i], 0.0f) << i;
}

// The switches: SetSplitF8 / SetSplitF8MinWeights set the defaults of options made afterwards.
TEST_F(GpuGemmGlueTest, SplitF8SwitchSetsTheOptionsDefault) {
  const bool before = cuda::SplitF8();
  const int64_t weights_before = cuda::SplitF8MinWeights();
  cuda::SetSplitF8(true);
  cuda::SetSplitF8MinWeights(77);
  EXPECT_TRUE(cuda::DenseGemmOptions{}.split_f8);
  EXPECT_EQ(cuda::DenseGemmOptions{}.split_f8_min_weights, 77);
  cuda::SetSplitF8(false);
  EXPECT_FALSE(cuda::DenseGemmOptions{}.split_f8);
  cuda::SetSplitF8(before);
  cuda::SetSplitF8MinWeights(weights_before);
}

// A split_f8 plan with a size threshold: matrices from split_f8_min_weights take the F8 form, the
// others keep the three f16 products, over ONE converted input in any order (the split rows stay
// intact beside the fp8 rows): the F8 ones within 3e-5 of f64, the others bit for bit as in a plan
// without split_f8; prepared bytes 4 and 6 per weight (+ the F8 copy's padding rows and scale).
TEST_F(GpuGemmGlueTest, SplitF8SizeThresholdMixesBothFormsOverOneInput) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t cols = 512, n = 45, big_rows = 520, small_rows = 64;
  const gpu_testing::TestMatrix big = RandomMatrix(rng, WeightType::kQ8_0, cols, big_rows, 0.02f);
  const gpu_testing::TestMatrix small = RandomMatrix(rng, WeightType::kQ8_0, cols, small_rows, 0.02f);
  const cuda::DeviceMatrix mb = big.gpu(), ms = small.gpu();
  const std::vector<float> x = OutlierActivations(rng, n, cols);
  auto d_x = Upload(x);
  std::unique_ptr<cuda::DenseGemm> old = MakeGemm(GemmMode::kFastSplit, GemmAlgo::kGemmEx, 64, cols);
  ASSERT_NE(old, nullptr);
  ASSERT_TRUE(old->Prepare(ms, GemmMode::kFastSplit).ok());
  auto d_old = Poisoned<float>(static_cast<size_t>(n * small_rows));
  ASSERT_TRUE(old->Run(ms, d_x.get(), n, d_old.get(), nullptr, GemmMode::kFastSplit).ok());
  const std::vector<float> small_want = Download(d_old);
  const std::vector<double> big_want = ProductF64(big, x, n);
  std::unique_ptr<cuda::DenseGemm> g =
      MakeGemm(GemmMode::kFastSplit, GemmAlgo::kGemmEx, 64, cols, true, /*split_f8=*/true, /*f8_min_weights=*/100000);
  ASSERT_NE(g, nullptr);
  ASSERT_TRUE(g->Prepare(mb, GemmMode::kFastSplit).ok());
  ASSERT_TRUE(g->Prepare(ms, GemmMode::kFastSplit).ok());
  EXPECT_EQ(g->prepared_bytes(), (big_rows + 16) * cols * 4 + 256 + small_rows * cols * 6);
  absl::StatusOr<cuda::DenseGemm::F16Input> in = g->ConvertInput(d_x.get(), n, cols, GemmMode::kFastSplit, nullptr);
  ASSERT_TRUE(in.ok()) << in.status();
  auto d_b = Poisoned<float>(static_cast<size_t>(n * big_rows));
  auto d_s = Poisoned<float>(static_cast<size_t>(n * small_rows));
  for (int order = 0; order < 2; ++order) {  // F8 first (fp8 rows made, split rows must stay), then f16 first
    if (order == 0) {
      ASSERT_TRUE(g->RunInput(mb, *in, d_b.get(), nullptr).ok());
      ASSERT_TRUE(g->RunInput(ms, *in, d_s.get(), nullptr).ok());
    } else {
      ASSERT_TRUE(g->RunInput(ms, *in, d_s.get(), nullptr).ok());
      ASSERT_TRUE(g->RunInput(mb, *in, d_b.get(), nullptr).ok());
    }
    EXPECT_LE(gpu_testing::LogError("f8_threshold_big_order" + std::to_string(order), RelL2F64(Download(d_b), big_want)),
              3e-5);
    EXPECT_EQ(Download(d_s), small_want) << "the f16 triple over a split_f8 plan's rows, order " << order;
  }
}

// The layer loop's fused read end to end at a step of 512 tokens of h 2048: the norm writing x and
// its f16 rows into the scratch, recorded, then the router-like product (split) and a mixer-like
// product (kFast), against norm, then Run converting: the same bits.
TEST_F(GpuGemmGlueTest, FusedNormThenProductIsBitIdenticalToNormConvertProduct) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t h = 2048, n = 512, rows = 512;
  const std::vector<float> H = Random(rng, static_cast<size_t>(n * h), 2.0f);
  const auto gamma = Upload(Random(rng, static_cast<size_t>(h), 0.2f, 1.0f));
  const auto y_prev = Upload(Random(rng, static_cast<size_t>(n * h)));
  const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, h, rows, 0.02f);
  const cuda::DeviceMatrix m = w.gpu();
  for (GemmMode mode : {GemmMode::kFastSplit, GemmMode::kFast}) {
    std::unique_ptr<cuda::DenseGemm> g = MakeGemm(GemmMode::kFastSplit, GemmAlgo::kGemmEx, n, h);
    ASSERT_NE(g, nullptr);
    ASSERT_TRUE(g->Prepare(m, GemmMode::kFastSplit).ok());  // serves kFast Runs too
    auto H_old = Upload(H), H_new = Upload(H);
    auto x_old = Poisoned<float>(static_cast<size_t>(n * h)), x_new = Poisoned<float>(static_cast<size_t>(n * h));
    TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(H_old.get(), n, 1, h, nullptr, y_prev.get(), gamma.get(), 1e-6f,
                                                 x_old.get(), nullptr));
    auto d_old = Poisoned<float>(static_cast<size_t>(n * rows));
    ASSERT_TRUE(g->Run(m, x_old.get(), n, d_old.get(), nullptr, mode).ok());
    TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNormF16(H_new.get(), n, 1, h, nullptr, y_prev.get(), gamma.get(), 1e-6f,
                                                    x_new.get(), mode == GemmMode::kFastSplit ? 3 : 1,
                                                    g->input_scratch(), nullptr));
    g->SetConverted(x_new.get(), n, h, mode);
    auto d_new = Poisoned<float>(static_cast<size_t>(n * rows));
    ASSERT_TRUE(g->Run(m, x_new.get(), n, d_new.get(), nullptr, mode).ok());
    EXPECT_EQ(Download(x_new), Download(x_old));
    EXPECT_EQ(Download(d_new), Download(d_old)) << (mode == GemmMode::kFast ? "fast" : "split");
  }
}

// SiLU(gate)·up of a stacked gate/up GEMM written as f16 rows for the next product
// (LaunchSiluMulToF16Rows): hi + lo within 1e-6 of the f32 value (relative L2), hi alone within
// f16's rounding, the stacked gate logit copied exactly; both the vector (ffn % 8 == 0) and the
// scalar kernel.
TEST(GpuDenseSiluRows, MatchesF32AndCopiesGateLogit) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (int64_t ffn : {512, 37}) {
    const int64_t n = 29, ld = 2 * ffn + 8, gate_col = 2 * ffn + 3;
    const std::vector<float> gu = Random(rng, static_cast<size_t>(n * ld), 2.0f);
    auto d_gu = Upload(gu);
    std::vector<float> want(static_cast<size_t>(n * ffn)), want_gate(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < ffn; ++j) {
        const double g = gu[t * ld + j];
        want[t * ffn + j] = static_cast<float>(g / (1.0 + std::exp(-g)) * gu[t * ld + ffn + j]);
      }
      want_gate[t] = gu[t * ld + gate_col];
    }
    for (bool split : {true, false}) {
      const int64_t width = (split ? 3 : 1) * ffn;
      auto d_a = Poisoned<uint16_t>(static_cast<size_t>(n * width));
      auto d_gate = Poisoned<float>(static_cast<size_t>(n));
      TANDEM_ASSERT_CUDA(cuda::LaunchSiluMulToF16Rows(d_gu.get(), n, ld, ffn, split, d_a.get(), gate_col,
                                                       d_gate.get(), nullptr));
      const std::vector<uint16_t> a = Download(d_a);
      std::vector<float> got(static_cast<size_t>(n * ffn));
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t j = 0; j < ffn; ++j) {
          const uint16_t* row = a.data() + t * width;
          float v = Fp16ToFp32(row[j]);
          if (split) {  // [lo | hi | hi]
            ASSERT_EQ(row[cuda::kSplitHiThird * ffn + j], row[(cuda::kSplitHiThird + 1) * ffn + j]);
            v = Fp16ToFp32(row[cuda::kSplitHiThird * ffn + j]) + Fp16ToFp32(row[cuda::kSplitLoThird * ffn + j]);
          }
          got[t * ffn + j] = v;
        }
      }
      const std::string name = std::string("silu_rows_") + (split ? "split" : "hi") + "_ffn" + std::to_string(ffn);
      EXPECT_LE(gpu_testing::LogError(name, RelL2(got, want)), split ? 1e-6 : 1e-3) << name;
      EXPECT_EQ(Download(d_gate), want_gate);
    }
  }
  EXPECT_EQ(cuda::LaunchSiluMulToF16Rows(nullptr, 1, 8, 4, true, nullptr, -1, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem
