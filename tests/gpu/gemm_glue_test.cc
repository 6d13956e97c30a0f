// The prefill glue around the dense products (glue512, 2026-12-01; NOT yet run on a GPU when
// written): the cuBLAS paths of the prepared products (GemmAlgo: cublasGemmEx, cublasLt's first
// algorithm, cublasLt without split-K) against each other and the CPU reference, and the
// converted-input record (DenseGemm::SetConverted) that lets the stream norm write a product's f16
// input rows itself (LaunchInjectRmsNormF16) bit for bit as the old norm-then-convert path.
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/reference/matmul.h"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

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

std::unique_ptr<cuda::DenseGemm> MakeGemm(GemmMode mode, GemmAlgo algo, int64_t max_n, int64_t max_cols,
                                          bool one_product = true) {
  cuda::DenseGemmOptions o;
  o.mode = mode;
  o.max_n = max_n;
  o.max_cols = max_cols;
  o.tile_bytes = 64ll << 20;
  o.workspace_bytes = 32ll << 20;
  o.split_one_product = one_product;
  o.prepared_algo = algo;
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
  std::mt19937 rng(std::random_device{}());
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
  std::mt19937 rng(std::random_device{}());
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

// The layer loop's fused read end to end at a step of 512 tokens of h 2048: the norm writing x and
// its f16 rows into the scratch, recorded, then the router-like product (split) and a mixer-like
// product (kFast), against norm, then Run converting: the same bits.
TEST_F(GpuGemmGlueTest, FusedNormThenProductIsBitIdenticalToNormConvertProduct) {
  std::mt19937 rng(std::random_device{}());
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

}  // namespace
}  // namespace tandem
