// Q8_0x8, the layout the CUDA backend uploads its Q8_0 product matrices in (device_matrix.h):
// every dense kernel that takes it (matvec of every kernel choice and split, DequantizeRows,
// DenseGemm Run and Prepare) against the CPU reference of the ggml Q8_0 matrix it was regrouped
// from, and the kernels that do not take it refuse it.
#include <cmath>
#include <cstring>
#include <vector>

#include "common/reference/matmul.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/embedding.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RandomMatrix;
using gpu_testing::Regroup;
using gpu_testing::Regrouped;
using gpu_testing::RelL2;
using gpu_testing::Upload;

class GpuQ8_0x8Test : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

TEST_F(GpuQ8_0x8Test, DequantizeRowsEqualsTheQ8_0Rows) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, 2304, 37);
  const Regrouped g = Regroup(w, 32, 16);
  auto d_a = Poisoned<float>(static_cast<size_t>(35 * w.cols));
  auto d_b = Poisoned<float>(static_cast<size_t>(35 * w.cols));
  TANDEM_ASSERT_CUDA(cuda::LaunchDequantizeRows(w.gpu(), 2, 35, false, d_a.get(), nullptr));
  TANDEM_ASSERT_CUDA(cuda::LaunchDequantizeRows(g.m, 2, 35, false, d_b.get(), nullptr));
  const std::vector<float> a = Download(d_a), b = Download(d_b);
  ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  std::vector<float> want(a.size());
  for (int64_t r = 0; r < 35; ++r) DequantizeMatrixRow(w.view(), r + 2, want.data() + r * w.cols);
  EXPECT_LE(gpu_testing::LogError("q8_0x8_dequantize", RelL2(b, want)), 1e-6);
}

// Every kernel choice and forced split, n = 1..8 with padded activation and output strides, on:
// rows shorter than 32 pieces, odd row counts ending mid-group, a padded row stride at a 16-byte
// offset with enough rows that blocks walk several groups, 4096 columns (8 activation rows run
// as grid.y chunks), and rows too wide for the streaming kernel.
TEST_F(GpuQ8_0x8Test, MatVecMatchesReferenceForEveryKernelChoice) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t cols, rows, pad, offset;
  };
  const Case cases[] = {{256, 37, 0, 0}, {512, 129, 16, 16}, {2048, 1031, 16, 16}, {4096, 67, 0, 0}, {20480, 5, 0, 0}};
  using K = cuda::MatVecKernel;
  struct Choice {
    const char* name;
    cuda::MatVecOptions options;
  };
  const Choice choices[] = {{"auto", {K::kAuto, 0, 0}},      {"previous", {K::kPrevious, 0, 0}},
                            {"generic", {K::kGeneric, 0, 0}}, {"stream", {K::kStream, 0, 0}},
                            {"wpr1_b1", {K::kAuto, 1, 1}},    {"wpr2_b1", {K::kAuto, 2, 1}},
                            {"wpr4_b1", {K::kAuto, 4, 1}},    {"wpr8_b9", {K::kAuto, 8, 9}}};
  for (const Case& c : cases) {
    const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, c.cols, c.rows, 0.05f);
    const Regrouped g = Regroup(w, c.pad, c.offset);
    const int64_t x_stride = c.cols + 4, y_stride = c.rows + 3;
    for (int n = 1; n <= cuda::kMatVecMaxRows; ++n) {
      const std::vector<float> x = Random(rng, static_cast<size_t>(n * x_stride));
      auto d_x = Upload(x);
      std::vector<float> xs(static_cast<size_t>(n * c.cols)), want(static_cast<size_t>(n * c.rows));
      for (int t = 0; t < n; ++t) std::memcpy(&xs[t * c.cols], &x[t * x_stride], c.cols * sizeof(float));
      MatMul(w.view(), xs.data(), n, want.data(), nullptr);
      for (const Choice& ch : choices) {
        if (ch.options.kernel == K::kGeneric && n != 1 && n != 8) continue;  // the slow one: ends only
        auto d_y = Poisoned<float>(static_cast<size_t>(n * y_stride));
        TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVec(g.m, d_x.get(), x_stride, n, d_y.get(), y_stride, ch.options, nullptr));
        const std::vector<float> y = Download(d_y);
        std::vector<float> got(want.size());
        for (int t = 0; t < n; ++t) {
          std::memcpy(&got[t * c.rows], &y[t * y_stride], c.rows * sizeof(float));
          for (int64_t i = c.rows; i < y_stride; ++i) EXPECT_TRUE(std::isnan(y[t * y_stride + i])) << ch.name;
        }
        const std::string what = std::string("q8_0x8_matvec_") + ch.name + "_c" + std::to_string(c.cols) + "_r" +
                                 std::to_string(c.rows) + "_pad" + std::to_string(c.pad) + "_n" + std::to_string(n);
        EXPECT_LE(gpu_testing::LogError(what, RelL2(got, want)), 1e-5) << what;
      }
    }
  }
}

TEST_F(GpuQ8_0x8Test, GemmRunAndPreparedMatchReference) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t cols = 512, rows = 320, n = 45;
  const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, cols, rows, 0.05f);
  const Regrouped g = Regroup(w);
  const std::vector<float> x = Random(rng, static_cast<size_t>(n * cols));
  std::vector<float> want(static_cast<size_t>(n * rows));
  MatMul(w.view(), x.data(), n, want.data(), nullptr);
  auto d_x = Upload(x);
  using cuda::GemmMode;
  for (GemmMode plan : {GemmMode::kExact, GemmMode::kFast, GemmMode::kFastSplit}) {
    for (bool prepare : {false, true}) {
      const cuda::DenseGemmOptions options = gpu_testing::SmallGemmOptions(plan, cols);
      auto gemm = cuda::DenseGemm::Create(options);
      ASSERT_TRUE(gemm.ok()) << gemm.status();
      if (prepare) {
        ASSERT_TRUE((*gemm)->Prepare(g.m).ok());
      }
      auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
      ASSERT_TRUE((*gemm)->Run(g.m, d_x.get(), n, d_y.get(), nullptr).ok());
      const std::string name = std::string("q8_0x8_gemm_") + (prepare ? "prepared_" : "tiled_") +
                               (plan == GemmMode::kFast ? "fast" : plan == GemmMode::kFastSplit ? "split" : "exact");
      EXPECT_LE(gpu_testing::LogError(name, RelL2(Download(d_y), want)),
                plan == GemmMode::kFast ? 1e-2 : plan == GemmMode::kFastSplit ? 2e-5 : 1e-5)
          << name;
    }
  }
}

// Misaligned data, a row stride below the natural one, rows that are not whole super-blocks, and
// the kernels without a Q8_0x8 reader (the embedding gather) are refused, never read.
TEST_F(GpuQ8_0x8Test, UnsupportedUsesAreRefused) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, 512, 8);
  const Regrouped g = Regroup(w, 0, 16);
  auto d_x = Poisoned<float>(512);
  auto d_y = Poisoned<float>(8);
  cuda::DeviceMatrix bad = g.m;
  bad.data = static_cast<const uint8_t*>(g.m.data) + 2;
  EXPECT_EQ(cuda::LaunchDenseMatVec(bad, d_x.get(), 512, 1, d_y.get(), 8, nullptr), cudaErrorInvalidValue);
  bad = g.m;
  bad.row_bytes -= 16;
  EXPECT_EQ(cuda::LaunchDenseMatVec(bad, d_x.get(), 512, 1, d_y.get(), 8, nullptr), cudaErrorInvalidValue);
  bad = g.m;
  bad.cols = 288;
  EXPECT_EQ(cuda::LaunchDenseMatVec(bad, d_x.get(), 288, 1, d_y.get(), 8, nullptr), cudaErrorInvalidValue);
  const std::vector<int32_t> tokens = {1};
  auto d_tokens = Upload(tokens);
  EXPECT_EQ(cuda::LaunchEmbeddingGather(g.m, d_tokens.get(), 1, 1, d_x.get(), nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem
