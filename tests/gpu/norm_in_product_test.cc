// The norm formed inside a one-row product (dense_matvec.cuh LaunchDenseMatVecNormIn, the streaming
// kernel's norm-in form) and the inject it leaves to the next norm (norm_streams.cuh
// EarlierInject): the decode chain they replace is the norm's launch, then the plain product over
// its x, then the next norm. Both must give the same bits as that chain: y against the norm kernel
// followed by the plain product, for every row width the register norm kernel takes (each of its
// thread splits), with and without the pending inject and its shared term, H read before or after
// the PDL wait; and the next norm with the earlier inject against two norms in a row. H must come
// out of the product unwritten. Fresh random inputs, outputs poisoned before every run.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/reference/matmul.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
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

class GpuNormInProductTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

enum class Pending { kNone, kY, kShared, kGatedShared };

const char* PendingName(Pending p) {
  switch (p) {
    case Pending::kNone: return "none";
    case Pending::kY: return "y";
    case Pending::kShared: return "y_shared";
    case Pending::kGatedShared: return "y_gated_shared";
  }
  return "?";
}

// A random Q8_0 matrix of cols x rows (regrouped to Q8_0x8, which the norm-in product must take) and
// the norm's inputs: H, γ and a pending y, cols floats each.
struct NormInInputs {
  gpu_testing::TestMatrix w;
  Regrouped g;
  std::vector<float> H;
  gpu_testing::DeviceArray<float> gamma, y;
};

NormInInputs RandomNormInInputs(std::mt19937& rng, int64_t cols, int64_t rows) {
  NormInInputs in{RandomMatrix(rng, WeightType::kQ8_0, cols, rows, 0.05f), {}, {}, {}, {}};
  in.g = Regroup(in.w);
  EXPECT_TRUE(cuda::DenseMatVecNormInTakes(in.g.m)) << cols;
  in.H = Random(rng, static_cast<size_t>(cols), 2.0f);
  in.gamma = Upload(Random(rng, static_cast<size_t>(cols), 0.2f, 1.0f));
  in.y = Upload(Random(rng, static_cast<size_t>(cols)));
  return in;
}

// Widths cover each thread split of the register norm kernel (norm_row::RegSplitFor): 256 (1 x 128),
// 1024 (2 x 128), 1536 (4 x 128), 2048 (2 x 256: the 80B models), 3072 (4 x 256).
// At 2048 columns also the kernel with that width compiled in (cuda::NormInLean): the same bits.
TEST_F(GpuNormInProductTest, ProductWithItsNormIsBitIdenticalToNormThenProduct) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t cols, rows;
  };
  const Case cases[] = {{256, 37}, {1024, 1031}, {1536, 300}, {2048, 4480}, {3072, 129}};
  constexpr float kEps = 1e-6f;
  for (const Case& c : cases) {
    const NormInInputs inputs = RandomNormInInputs(rng, c.cols, c.rows);
    const gpu_testing::TestMatrix& w = inputs.w;
    const Regrouped& g = inputs.g;
    const std::vector<float>& H = inputs.H;
    const auto& d_gamma = inputs.gamma;
    const auto& d_y = inputs.y;
    const int64_t h = c.cols;
    const auto d_shared = Upload(Random(rng, static_cast<size_t>(h), 0.1f));
    const auto d_logit = Upload(Random(rng, 1));
    for (const Pending p : {Pending::kNone, Pending::kY, Pending::kShared, Pending::kGatedShared}) {
      for (const bool h_early : {false, true}) {
        const std::string tag = "norm_in_c" + std::to_string(c.cols) + "_r" + std::to_string(c.rows) + "_" +
                                PendingName(p) + (h_early ? "_early" : "");
        cuda::PendingShared sh;
        if (p == Pending::kShared || p == Pending::kGatedShared) sh.shared = d_shared.get();
        if (p == Pending::kGatedShared) sh.gate_logit = d_logit.get();
        const float* y = p == Pending::kNone ? nullptr : d_y.get();
        // The chain it replaces: the norm (H += y_eff, x), then the plain product over x.
        auto H_chain = Upload(H);
        auto x = Poisoned<float>(static_cast<size_t>(h));
        auto want = Poisoned<float>(static_cast<size_t>(c.rows));
        TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(H_chain.get(), 1, 1, h, nullptr, y, d_gamma.get(), kEps, x.get(),
                                                     nullptr, nullptr, &sh, h_early));
        TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVec(g.m, x.get(), h, 1, want.get(), c.rows, nullptr));
        // The product with its norm.
        auto H_in = Upload(H);
        auto got = Poisoned<float>(static_cast<size_t>(c.rows));
        cuda::MatVecNormIn in;
        in.H = H_in.get();
        in.y = y;
        in.sh = sh;
        in.gamma = d_gamma.get();
        in.eps = kEps;
        in.h_written_earlier = h_early;
        const bool was_lean = cuda::NormInLean();
        cuda::SetNormInLean(false);  // the general kernel here; the lean one below
        TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVecNormIn(g.m, in, got.get(), nullptr));
        cuda::SetNormInLean(was_lean);
        TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
        const std::vector<float> got_h = Download(got), want_h = Download(want);
        EXPECT_EQ(std::memcmp(got_h.data(), want_h.data(), got_h.size() * sizeof(float)), 0) << tag;
        EXPECT_EQ(Download(H_in), H) << tag << ": the product wrote H";
        // At the lean form's width (cuda::SetNormInLean): its kernel, the same bits.
        if (c.cols == cuda::kNormInLeanCols) {
          const uint64_t launches = cuda::NormInLeanLaunches();
          cuda::SetNormInLean(true);
          auto H_lean = Upload(H);
          auto lean = Poisoned<float>(static_cast<size_t>(c.rows));
          in.H = H_lean.get();
          TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVecNormIn(g.m, in, lean.get(), nullptr));
          TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
          cuda::SetNormInLean(was_lean);
          EXPECT_EQ(cuda::NormInLeanLaunches(), launches + 1) << tag << ": the lean kernel did not run";
          const std::vector<float> lean_h = Download(lean);
          EXPECT_EQ(std::memcmp(lean_h.data(), want_h.data(), lean_h.size() * sizeof(float)), 0) << tag << " (lean)";
        }
        // Not the same wrong answer on both sides: the chain's x against the CPU reference product.
        std::vector<float> ref(static_cast<size_t>(c.rows));
        const std::vector<float> x_h = Download(x);
        MatMul(w.view(), x_h.data(), 1, ref.data(), nullptr);
        EXPECT_LE(gpu_testing::LogError(tag, RelL2(got_h, ref)), 1e-5) << tag;
      }
    }
  }
}

// The next norm given the inject the product left (EarlierInject): N and H as the two norms in a
// row would leave them (the earlier one adding y0 + g·shared0, the next y1), for every register
// split and each form of the earlier term.
TEST_F(GpuNormInProductTest, EarlierInjectEqualsTheTwoNormsItReplaces) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  constexpr float kEps = 1e-6f;
  for (const int64_t h : {256, 1024, 1536, 2048, 3072, 4096}) {
    const std::vector<float> H = Random(rng, static_cast<size_t>(h), 2.0f);
    const auto d_gamma0 = Upload(Random(rng, static_cast<size_t>(h), 0.2f, 1.0f));
    const auto d_gamma1 = Upload(Random(rng, static_cast<size_t>(h), 0.2f, 1.0f));
    const auto d_y0 = Upload(Random(rng, static_cast<size_t>(h)));
    const auto d_y1 = Upload(Random(rng, static_cast<size_t>(h)));
    const auto d_shared = Upload(Random(rng, static_cast<size_t>(h), 0.1f));
    const auto d_logit = Upload(Random(rng, 1));
    for (const Pending p : {Pending::kY, Pending::kShared, Pending::kGatedShared}) {
      const std::string tag = "earlier_inject_h" + std::to_string(h) + "_" + PendingName(p);
      cuda::PendingShared sh;
      if (p != Pending::kY) sh.shared = d_shared.get();
      if (p == Pending::kGatedShared) sh.gate_logit = d_logit.get();
      auto H_two = Upload(H), H_one = Upload(H);
      auto x0 = Poisoned<float>(static_cast<size_t>(h));
      auto N_two = Poisoned<float>(static_cast<size_t>(h)), N_one = Poisoned<float>(static_cast<size_t>(h));
      TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(H_two.get(), 1, 1, h, nullptr, d_y0.get(), d_gamma0.get(), kEps,
                                                   x0.get(), nullptr, nullptr, &sh));
      TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(H_two.get(), 1, 1, h, nullptr, d_y1.get(), d_gamma1.get(), kEps,
                                                   N_two.get(), nullptr, nullptr, nullptr, true));
      const cuda::EarlierInject earlier{d_y0.get(), sh};
      TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(H_one.get(), 1, 1, h, nullptr, d_y1.get(), d_gamma1.get(), kEps,
                                                   N_one.get(), nullptr, nullptr, nullptr, true, &earlier));
      EXPECT_EQ(Download(N_one), Download(N_two)) << tag << " N";
      EXPECT_EQ(Download(H_one), Download(H_two)) << tag << " H";
    }
  }
}

// What the two launches refuse: matrices other than Q8_0x8 or rows the register norm kernel or
// the shared memory do not take, missing inputs, a shared term without y; the earlier inject with
// several streams, inject weights or rows past the register kernel.
TEST_F(GpuNormInProductTest, UnsupportedUsesAreRefused) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::TestMatrix w = RandomMatrix(rng, WeightType::kQ8_0, 2048, 64, 0.05f);
  const Regrouped g = Regroup(w);
  EXPECT_FALSE(cuda::DenseMatVecNormInTakes(w.gpu())) << "ggml Q8_0";
  const gpu_testing::TestMatrix wide = RandomMatrix(rng, WeightType::kQ8_0, 4096, 16, 0.05f);
  EXPECT_FALSE(cuda::DenseMatVecNormInTakes(Regroup(wide).m)) << "four staged rows of 4096 floats";
  auto H = Upload(Random(rng, 8192)), gamma = Upload(Random(rng, 8192)), yv = Upload(Random(rng, 8192));
  auto out = Poisoned<float>(64);
  cuda::MatVecNormIn in;
  in.H = H.get();
  in.gamma = gamma.get();
  TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVecNormIn(g.m, in, out.get(), nullptr));
  EXPECT_EQ(cuda::LaunchDenseMatVecNormIn(w.gpu(), in, out.get(), nullptr), cudaErrorInvalidValue);
  cuda::MatVecNormIn no_h = in;
  no_h.H = nullptr;
  EXPECT_EQ(cuda::LaunchDenseMatVecNormIn(g.m, no_h, out.get(), nullptr), cudaErrorInvalidValue);
  cuda::MatVecNormIn no_gamma = in;
  no_gamma.gamma = nullptr;
  EXPECT_EQ(cuda::LaunchDenseMatVecNormIn(g.m, no_gamma, out.get(), nullptr), cudaErrorInvalidValue);
  cuda::MatVecNormIn shared_alone = in;
  shared_alone.sh.shared = yv.get();
  EXPECT_EQ(cuda::LaunchDenseMatVecNormIn(g.m, shared_alone, out.get(), nullptr), cudaErrorInvalidValue);

  auto N = Poisoned<float>(3 * 8192);
  auto Hs = Upload(Random(rng, 3 * 8192)), a = Upload(Random(rng, 3));
  const cuda::EarlierInject earlier{yv.get(), {}};
  EXPECT_EQ(cuda::LaunchInjectRmsNorm(Hs.get(), 1, 3, 2048, nullptr, yv.get(), gamma.get(), 1e-6f, N.get(), nullptr,
                                      nullptr, nullptr, false, &earlier),
            cudaErrorInvalidValue)
      << "three streams";
  EXPECT_EQ(cuda::LaunchInjectRmsNorm(Hs.get(), 1, 1, 2048, a.get(), yv.get(), gamma.get(), 1e-6f, N.get(), nullptr,
                                      nullptr, nullptr, false, &earlier),
            cudaErrorInvalidValue)
      << "inject weights";
  EXPECT_EQ(cuda::LaunchInjectRmsNorm(Hs.get(), 1, 1, 8192, nullptr, yv.get(), gamma.get(), 1e-6f, N.get(), nullptr,
                                      nullptr, nullptr, false, &earlier),
            cudaErrorInvalidValue)
      << "rows past the register kernel";
  const cuda::EarlierInject none;
  TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(Hs.get(), 1, 1, 8192, nullptr, yv.get(), gamma.get(), 1e-6f, N.get(),
                                               nullptr, nullptr, nullptr, false, &none));
}

}  // namespace
}  // namespace tandem
