// The column-split one-row product (dense_colsplit.cu: LaunchColumnSplitMatVec) against the host's
// product over the dequantized Q8_0 rows, in double: y (starting from random values, to show the
// kernel adds) within 1e-4 relative L2 (x goes in as int16, one scale per 32: ~1e-5 a row). Shapes:
// attention's o at 80B (4096 → 2048) and small (1024 → 1024) shapes, GDN's ssm_out, one super-block
// of columns, rows that leave few slices, a padded row stride. Also the matrices it refuses, and
// the stamped instantiation a probed step launches (dense_colsplit_probe.h).
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/dense_colsplit_probe.h"
#include "gtest/gtest.h"
#include "tests/armed_probe_check.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Random;
using gpu_testing::Upload;

struct Shape {
  int64_t cols, rows, pad;
};

class GpuColumnSplitTest : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

TEST_P(GpuColumnSplitTest, AddsTheProduct) {
  const auto [cols, rows, pad] = GetParam();
  const std::string tag = std::to_string(cols) + "x" + std::to_string(rows) + (pad > 0 ? " padded" : "");
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::TestMatrix w = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, cols, rows, 0.05f);
  const gpu_testing::Regrouped g = gpu_testing::Regroup(w, pad);
  const cuda::DeviceMatrix& m = g.m;
  ASSERT_TRUE(cuda::ColumnSplitMatVecFits(m)) << tag;
  const std::vector<float> x = Random(rng, static_cast<size_t>(cols)), y0 = Random(rng, static_cast<size_t>(rows));
  const auto x_dev = Upload(x);
  auto y = Upload(y0);
  TANDEM_ASSERT_CUDA(cuda::LaunchColumnSplitMatVec(m, x_dev.get(), y.get(), nullptr));
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<float> want = gpu_testing::HostProduct(w, x, y0);
  EXPECT_LE(gpu_testing::LogError("column split " + tag, gpu_testing::RelL2(Download(y), want)), 1e-4) << tag;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuColumnSplitTest,
                         ::testing::Values(Shape{4096, 2048, 0},   // attention's o at 80B shapes
                                           Shape{1024, 1024, 0},   // the small preset's o
                                           Shape{4096, 2048, 48},  // padded rows
                                           Shape{256, 8, 0},       // one super-block, one slice of 8 rows
                                           Shape{512, 2000, 0},    // slices that divide 2000 (<= 640 rows)
                                           Shape{2048, 5120, 0}),  // 8 supers, 16 slices of 320
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::to_string(info.param.cols) + "x" + std::to_string(info.param.rows) +
                                  (info.param.pad > 0 ? "_padded" : "");
                         });

// With the step probed (ProbeDecodeStep) and a buffer armed, every block of a launch takes one
// row of it (its index once, a real SM, its phases in order, no merge) and the product is still
// added; rows past the launch's blocks stay zero; disarmed, the stamped kernel writes no row.
TEST(ColumnSplitProbeTest, ArmedProbeStampsEveryBlockOnceAndAddsTheProduct) {
  TANDEM_SKIP_WITHOUT_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t cols = 4096, rows = 2048;  // attention's o at 80B shapes
  const int blocks = 16 * 8;               // 16 column super-blocks x 8 row slices of 256 (RowSlices)
  const gpu_testing::TestMatrix w = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, cols, rows, 0.05f);
  const gpu_testing::Regrouped g = gpu_testing::Regroup(w, 0);
  const std::vector<float> x = Random(rng, static_cast<size_t>(cols)), y0 = Random(rng, static_cast<size_t>(rows));
  const auto x_dev = Upload(x);
  const std::vector<float> want = gpu_testing::HostProduct(w, x, y0);
  const size_t capacity = static_cast<size_t>(2 * blocks);  // room for a second launch's rows
  auto stamps = Upload(std::vector<unsigned long long>(capacity * cuda::kColSplitProbeWords, 0));
  auto y = Upload(y0);
  auto y_after = Upload(y0);
  cudaError_t launched, relaunched;
  {
    const ::tandem::testing::ScopedProbeDecodeStep probed(true);
    ASSERT_EQ(cuda::SetArmedColumnSplitProbe(stamps.get(), static_cast<unsigned>(capacity), nullptr), cudaSuccess);
    launched = cuda::LaunchColumnSplitMatVec(g.m, x_dev.get(), y.get(), nullptr);
    ASSERT_EQ(cuda::SetArmedColumnSplitProbe(nullptr, 0, nullptr), cudaSuccess);
    // Disarmed: the stamped kernel again, no row taken.
    relaunched = cuda::LaunchColumnSplitMatVec(g.m, x_dev.get(), y_after.get(), nullptr);
  }
  TANDEM_ASSERT_CUDA(launched);
  TANDEM_ASSERT_CUDA(relaunched);
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_LE(gpu_testing::LogError("column split, probed", gpu_testing::RelL2(Download(y), want)), 1e-4);
  EXPECT_LE(gpu_testing::LogError("column split, disarmed", gpu_testing::RelL2(Download(y_after), want)), 1e-4);
  ::tandem::testing::ExpectEveryBlockOnce(
      Download(stamps), cuda::kColSplitProbeWords, blocks,
      [](const unsigned long long* row) { return row[cuda::kColSplitProbeBlock]; },
      [sms](int b, const unsigned long long* row) {
        EXPECT_LT(row[cuda::kColSplitProbeSm], static_cast<unsigned long long>(sms)) << "block " << b;
        EXPECT_EQ(row[cuda::kColSplitProbeMerged], 0u) << "block " << b;
        EXPECT_NE(row[cuda::kColSplitProbeEntry], 0u) << "block " << b;
        for (int p = 1; p < cuda::kColSplitProbePhases; ++p) {
          EXPECT_LE(row[p - 1], row[p]) << "block " << b << ", phase " << p;
        }
      });
}

alignas(16) constexpr uint8_t kBytes[16] = {};  // never read: every case is refused first

TEST(ColumnSplitRefusalTest, RefusesWhatItCannotTake) {
  const int64_t rb = cuda::Q8_0x8RowBytes(4096);
  struct Case {
    cuda::DeviceMatrix m;
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           {{static_cast<uint32_t>(WeightType::kQ8_0), kBytes, 4096, 2048, 4096 / 32 * 34}, "ggml Q8_0 layout"},
           {{cuda::kTypeQ8_0x8, kBytes, 4096, 2048, rb + 8}, "rows off 16-byte alignment"},
           {{cuda::kTypeQ8_0x8, kBytes + 4, 4096, 2048, rb}, "data off 16-byte alignment"},
           {{cuda::kTypeQ8_0x8, nullptr, 4096, 2048, rb}, "no data"},
           {{cuda::kTypeQ8_0x8, kBytes, 4096, 641, rb}, "641 rows: a prime over 640, no slice fits"},
           {{cuda::kTypeQ8_0x8, kBytes, 4096, 0, rb}, "no rows"},
       }) {
    EXPECT_FALSE(cuda::ColumnSplitMatVecFits(c.m)) << c.why;
    EXPECT_EQ(cuda::LaunchColumnSplitMatVec(c.m, nullptr, nullptr, nullptr), cudaErrorNotSupported) << c.why;
  }
}

// CopyQ8_0x8ByColumns: super-block j of row r of a regrouped matrix (padded rows too) at
// (j·rows + r)·272 of the copy, every byte as the host's regrouping put it; refused: another type,
// a misaligned destination.
TEST(CopyQ8_0x8ByColumnsTest, LaysTheSuperBlocksOutByColumns) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (const Shape& s : {Shape{768, 40, 32}, Shape{4096, 2048, 0}, Shape{256, 1, 0}}) {
    const gpu_testing::TestMatrix w = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, s.cols, s.rows, 0.05f);
    const gpu_testing::Regrouped g = gpu_testing::Regroup(w, s.pad);
    const int64_t natural = cuda::Q8_0x8RowBytes(s.cols), supers = s.cols / 256;
    std::vector<uint8_t> rows(static_cast<size_t>(natural * s.rows));
    cuda::RepackQ8_0x8(w.bytes.data(), w.row_bytes, s.rows, s.cols, rows.data());
    std::vector<uint8_t> want(static_cast<size_t>(cuda::Q8_0x8ByColumnsBytes(s.rows, s.cols)));
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t j = 0; j < supers; ++j) {
        std::memcpy(&want[(j * s.rows + r) * cuda::kQ8_0x8SuperBytes], &rows[r * natural + j * cuda::kQ8_0x8SuperBytes],
                    cuda::kQ8_0x8SuperBytes);
      }
    }
    auto copy = gpu_testing::Poisoned<uint8_t>(want.size());
    ASSERT_EQ(cuda::CopyQ8_0x8ByColumns(g.m, copy.get(), nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(Download(copy), want) << s.cols << " x " << s.rows;
    EXPECT_EQ(cuda::CopyQ8_0x8ByColumns(g.m, copy.get() + 8, nullptr), cudaErrorInvalidValue);
  }
  const cuda::DeviceMatrix ggml{static_cast<uint32_t>(WeightType::kQ8_0), kBytes, 256, 1, 34 * 8};
  EXPECT_EQ(cuda::CopyQ8_0x8ByColumns(ggml, const_cast<uint8_t*>(kBytes), nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem
