// Router logits (dense matrix-vector product) and the route kernel against the reference.
#include "gpu_service/backends/cuda/moe/router.h"

#include <cmath>

#include "common/reference/matmul.h"
#include "common/reference/moe.h"
#include "gpu_service/backends/cuda/moe/router.cuh"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::PoisonedBuffer;
using testing::RandomMatrix;
using testing::Upload;

class DenseMatVecTest : public ::testing::TestWithParam<WeightType> {};

TEST_P(DenseMatVecTest, MatchesReferenceMatMul) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const WeightType type = GetParam();
  const int64_t cols = 512, rows = 96;
  const std::vector<uint8_t> w = RandomMatrix(rng, type, cols, rows, 0.05f);
  const MatrixView view = testing::HostMatrix(type, w, cols, rows);
  DeviceBuffer dw = Upload(w);
  for (int64_t n : {1, 3, 13}) {
    const std::vector<float> x = testing::RandomVector(rng, n * cols);
    std::vector<float> ref(static_cast<size_t>(n * rows));
    MatMul(view, x.data(), n, ref.data(), nullptr);
    DeviceBuffer dx = Upload(x);
    DeviceBuffer dy = PoisonedBuffer(ref.size() * sizeof(float));
    ASSERT_TRUE(DenseMatVec("test", DeviceMatrix{static_cast<uint32_t>(type), dw.get(), cols, rows}, dx.as<float>(), n, dy.as<float>(), nullptr).ok());
    const std::vector<float> got = Download<float>(dy.get(), ref.size());
    ASSERT_TRUE(testing::AllFinite(got)) << "unwritten output rows (n=" << n << ")";
    EXPECT_LE(testing::RelativeL2(got, ref), 1e-5) << "n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, DenseMatVecTest,
                         ::testing::Values(WeightType::kF32, WeightType::kF16, WeightType::kBF16, WeightType::kQ4_0,
                                           WeightType::kQ8_0, WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K,
                                           WeightType::kQ5_K, WeightType::kQ6_K));

// Routing of GPU-computed logits equals RouteTokens on the same logits: identical picks and weights.
TEST(GpuRouterTest, PicksAndWeightsMatchRouteTokens) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t h = 256, E = 64, K = 6, n = 11;
  const std::vector<uint8_t> router = RandomMatrix(rng, WeightType::kF32, h, E, 0.1f);
  DeviceBuffer drouter = Upload(router);
  const std::vector<float> x = testing::RandomVector(rng, n * h);
  DeviceBuffer dx = Upload(x);
  DeviceBuffer logits = PoisonedBuffer(static_cast<size_t>(n * E) * sizeof(float));
  absl::StatusOr<GpuRouter> r = GpuRouter::Create(32, E, K);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->Route(DeviceMatrix{kTypeF32, drouter.get(), h, E}, dx.as<float>(), n, logits.as<float>(), nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> gpu_logits = Download<float>(logits.get(), static_cast<size_t>(n * E));
  std::vector<int32_t> experts(static_cast<size_t>(n * K));
  std::vector<float> weights(experts.size());
  RouteTokens(gpu_logits.data(), n, E, K, experts.data(), weights.data());
  for (int64_t i = 0; i < n * K; ++i) {
    EXPECT_EQ(r->experts()[i], experts[i]) << "pick " << i;
    EXPECT_NEAR(r->weights()[i], weights[i], 1e-6f) << "pick " << i;
  }
}

// Tied logits: the lower expert id wins, as in RouteTokens.
TEST(GpuRouterTest, TiesGoToTheLowerExpert) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t E = 512, K = 10, n = 7;
  std::uniform_int_distribution<int> level(0, 3);
  std::vector<float> logits(static_cast<size_t>(n * E));
  for (float& l : logits) l = 0.5f * level(rng);  // many exact ties
  DeviceBuffer dl = Upload(logits);
  absl::StatusOr<GpuRouter> r = GpuRouter::Create(n, E, K);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->RouteLogits(dl.as<float>(), n, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int32_t> experts(static_cast<size_t>(n * K));
  std::vector<float> weights(experts.size());
  RouteTokens(logits.data(), n, E, K, experts.data(), weights.data());
  for (int64_t i = 0; i < n * K; ++i) {
    EXPECT_EQ(r->experts()[i], experts[i]) << "pick " << i;
    EXPECT_NEAR(r->weights()[i], weights[i], 1e-6f) << "pick " << i;
  }
}

TEST(GpuRouterTest, RefusesBadShapes) {
  EXPECT_FALSE(GpuRouter::Create(4, 8, 9).ok());
  EXPECT_FALSE(GpuRouter::Create(0, 8, 2).ok());
  EXPECT_EQ(LaunchRouteTopK(nullptr, 1, 8, 0, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem::cuda
