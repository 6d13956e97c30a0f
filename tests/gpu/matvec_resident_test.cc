// The resident int8 MMA one-row product (kernels/matvec_resident.cuh): against the f64 product over the
// dequantized rows, within what quantizing x into two int8 terms per 32 columns costs (~1.5e-5 of a
// block's largest |x| an element); rows that are not a whole tile, padded row strides, blocks of x
// that are all zero or hold one outlier, and runs of one to six tiles a block; the same bits
// on every run; the norm-in form bit-identical to the norm kernel followed by the plain product
// (H unwritten); what it refuses.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/matvec_resident.cuh"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::HostProduct;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RandomMatrix;
using gpu_testing::Regroup;
using gpu_testing::Regrouped;
using gpu_testing::RelL2;
using gpu_testing::Upload;

class GpuResidentMatVecTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// x: normal values, one 32-column block of zeros and one with a single large outlier (its other
// 31 values then keep ~7 bits less of their own size: the bound below holds with it).
std::vector<float> TestActivations(std::mt19937& rng, int64_t cols) {
  std::vector<float> x = Random(rng, static_cast<size_t>(cols));
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = 0.0f;
  if (cols >= 128) x[96 + 5] = 60.0f;
  return x;
}

TEST_F(GpuResidentMatVecTest, MatchesTheF64ProductWithinActivationQuantization) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t cols, rows, pad, offset;
  };
  // 2048 x 12352: the 80B's stacked GDN inputs, six tiles a block on 132 SMs (~220 KB of shared memory).
  const Case cases[] = {{256, 37, 0, 0},  {512, 100, 16, 16}, {1024, 1031, 0, 0}, {1536, 300, 32, 0},
                        {2048, 17, 0, 0}, {2048, 4480, 0, 0}, {2048, 12352, 0, 0}};
  for (const Case& c : cases) {
    const std::string tag = "resident_c" + std::to_string(c.cols) + "_r" + std::to_string(c.rows) +
                            (c.pad > 0 ? "_pad" + std::to_string(c.pad) : "");
    const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, c.cols, c.rows, 0.05f);
    const Regrouped g = Regroup(w, c.pad, c.offset);
    ASSERT_TRUE(cuda::ResidentMatVecTakes(g.m)) << tag;
    const std::vector<float> x = TestActivations(rng, c.cols);
    const auto d_x = Upload(x);
    auto y = Poisoned<float>(static_cast<size_t>(c.rows));
    TANDEM_ASSERT_CUDA(cuda::LaunchResidentMatVec(g.m, d_x.get(), y.get(), nullptr));
    const std::vector<float> got = Download(y);
    const std::vector<float> want = HostProduct(w, x);
    EXPECT_LE(gpu_testing::LogError(tag, RelL2(got, want)), 1e-4) << tag;
    // Every row, not only the sum: |got - want| within the activation rounding's bound for that
    // row (Σ over blocks of max|x| / (127 · 254 · 2) · Σ|w|) plus f32 rounding.
    std::vector<float> row(static_cast<size_t>(c.cols));
    int bad = 0;
    for (int64_t r = 0; r < c.rows; ++r) {
      DequantizeRow(w.type, w.bytes.data() + r * w.row_bytes, row.data(), c.cols);
      double bound = 0.0, mag = 0.0;
      for (int64_t b = 0; b < c.cols / 32; ++b) {
        double amax = 0.0, wsum = 0.0;
        for (int64_t i = 32 * b; i < 32 * b + 32; ++i) {
          amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
          wsum += std::fabs(static_cast<double>(row[i]));
          mag += std::fabs(static_cast<double>(row[i]) * x[i]);
        }
        bound += amax / (127.0 * 254.0 * 2.0) * wsum;
      }
      const double err = std::fabs(static_cast<double>(got[r]) - want[r]);
      if (!(err <= 1.01 * bound + 1e-6 * mag)) {
        if (++bad <= 3) ADD_FAILURE() << tag << " row " << r << ": got " << got[r] << " want " << want[r];
      }
    }
    EXPECT_EQ(bad, 0) << tag;
    // The same bits again.
    auto y2 = Poisoned<float>(static_cast<size_t>(c.rows));
    TANDEM_ASSERT_CUDA(cuda::LaunchResidentMatVec(g.m, d_x.get(), y2.get(), nullptr));
    const std::vector<float> again = Download(y2);
    EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)), 0) << tag;
  }
}

TEST_F(GpuResidentMatVecTest, NormInIsBitIdenticalToNormThenProduct) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  constexpr float kEps = 1e-6f;
  for (const int64_t cols : {256, 1024, 1536, 2048}) {
    const int64_t rows = cols == 2048 ? 4480 : 129;
    const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, cols, rows, 0.05f);
    const Regrouped g = Regroup(w);
    ASSERT_TRUE(cuda::ResidentMatVecNormInTakes(g.m)) << cols;
    const std::vector<float> H = Random(rng, static_cast<size_t>(cols), 2.0f);
    const auto d_gamma = Upload(Random(rng, static_cast<size_t>(cols), 0.2f, 1.0f));
    const auto d_y = Upload(Random(rng, static_cast<size_t>(cols)));
    const auto d_shared = Upload(Random(rng, static_cast<size_t>(cols), 0.1f));
    const auto d_logit = Upload(Random(rng, 1));
    for (int pending = 0; pending < 3; ++pending) {  // none, y, y with a gated shared term
      for (const bool h_early : {false, true}) {
        const std::string tag = "resident_norm_in_c" + std::to_string(cols) + "_p" + std::to_string(pending) +
                                (h_early ? "_early" : "");
        cuda::PendingShared sh;
        if (pending == 2) {
          sh.shared = d_shared.get();
          sh.gate_logit = d_logit.get();
        }
        const float* y_in = pending == 0 ? nullptr : d_y.get();
        auto H_chain = Upload(H);
        auto x = Poisoned<float>(static_cast<size_t>(cols));
        auto want = Poisoned<float>(static_cast<size_t>(rows));
        TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(H_chain.get(), 1, 1, cols, nullptr, y_in, d_gamma.get(), kEps,
                                                     x.get(), nullptr, nullptr, &sh, h_early));
        TANDEM_ASSERT_CUDA(cuda::LaunchResidentMatVec(g.m, x.get(), want.get(), nullptr));
        auto H_in = Upload(H);
        auto got = Poisoned<float>(static_cast<size_t>(rows));
        cuda::MatVecNormIn in;
        in.H = H_in.get();
        in.y = y_in;
        in.sh = sh;
        in.gamma = d_gamma.get();
        in.eps = kEps;
        in.h_written_earlier = h_early;
        TANDEM_ASSERT_CUDA(cuda::LaunchResidentMatVecNormIn(g.m, in, got.get(), nullptr));
        const std::vector<float> got_h = Download(got), want_h = Download(want);
        EXPECT_EQ(std::memcmp(got_h.data(), want_h.data(), got_h.size() * sizeof(float)), 0) << tag;
        EXPECT_EQ(Download(H_in), H) << tag << ": the product wrote H";
        // Not the same wrong answer on both sides.
        EXPECT_LE(gpu_testing::LogError(tag, RelL2(got_h, HostProduct(w, Download(x)))), 1e-4) << tag;
      }
    }
  }
}

TEST_F(GpuResidentMatVecTest, UnsupportedUsesAreRefused) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, 2048, 64, 0.05f);
  const Regrouped g = Regroup(w);
  EXPECT_FALSE(cuda::ResidentMatVecTakes(w.gpu())) << "ggml Q8_0";
  const gpu_testing::TestMatrix wide = RandomMatrix(rng, WeightType::kQ8_0, 4096, 16, 0.05f);
  const Regrouped gw = Regroup(wide);
  EXPECT_FALSE(cuda::ResidentMatVecTakes(gw.m)) << "4096 columns";
  EXPECT_FALSE(cuda::ResidentMatVecNormInTakes(gw.m)) << "4096 columns";
  cuda::DeviceMatrix tall = g.m;
  tall.rows = 40000;  // ~19 tiles a block: past any SM's shared memory (only the shape is read)
  EXPECT_FALSE(cuda::ResidentMatVecTakes(tall)) << "rows past the shared memory";
  auto x = Upload(Random(rng, 2048 + 4));
  auto y = Poisoned<float>(64);
  TANDEM_ASSERT_CUDA(cuda::LaunchResidentMatVec(g.m, x.get(), y.get(), nullptr));
  EXPECT_EQ(cuda::LaunchResidentMatVec(w.gpu(), x.get(), y.get(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchResidentMatVec(g.m, nullptr, y.get(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchResidentMatVec(g.m, x.get(), nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchResidentMatVec(g.m, x.get() + 1, y.get(), nullptr), cudaErrorInvalidValue) << "misaligned x";
  cuda::MatVecNormIn in;
  in.H = x.get();
  in.gamma = x.get();
  TANDEM_ASSERT_CUDA(cuda::LaunchResidentMatVecNormIn(g.m, in, y.get(), nullptr));
  cuda::MatVecNormIn no_h = in;
  no_h.H = nullptr;
  EXPECT_EQ(cuda::LaunchResidentMatVecNormIn(g.m, no_h, y.get(), nullptr), cudaErrorInvalidValue);
  cuda::MatVecNormIn shared_alone = in;
  shared_alone.sh.shared = x.get();
  EXPECT_EQ(cuda::LaunchResidentMatVecNormIn(g.m, shared_alone, y.get(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace tandem
