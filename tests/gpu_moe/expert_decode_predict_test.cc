// The fused one-token MoE kernel's router blocks predict the next layer's experts (FusedRouter::next_*: the next router's top ids on this x), and the routed
// blocks ask for predicted rows into L2 (OneTokenMoeArgs::pred). The prediction must be the next
// router's top ids; neither it nor any prefetched id may change what the kernel computes.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <set>
#include <vector>

#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"
#include "tests/gpu_moe/one_token_support.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using one_token_testing::OneTokenExperts;
using one_token_testing::OneTokenStep;
using one_token_testing::Shared;
using testing::Download;

TEST(OneTokenFusedPredictTest, RouterBlocksPickTheNextLayersTopIdsAndChangeNothing) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  constexpr int64_t kH = 2048, kI = 512, kE = 512;
  constexpr int kK = 10, kPredict = 20;
  const OneTokenExperts ex(rng, kH, kI, kE, kK);
  const std::vector<float> w = testing::RandomVector(rng, kE * kH, 0.05f);
  const std::vector<float> next_w = testing::RandomVector(rng, kE * kH, 0.05f);
  const std::vector<float> x = testing::RandomVector(rng, kH);
  std::vector<double> want(static_cast<size_t>(kE));
  for (int64_t r = 0; r < kE; ++r) {
    double s = 0.0;
    for (int64_t j = 0; j < kH; ++j) s += static_cast<double>(next_w[r * kH + j]) * x[j];
    want[static_cast<size_t>(r)] = s;
  }
  std::vector<double> sorted = want;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  const DeviceBuffer dw = testing::Upload(w), dnext = testing::Upload(next_w);
  DeviceBuffer counters = testing::Upload(std::vector<int32_t>(2, 0));
  DeviceBuffer predict = testing::Upload(std::vector<int32_t>(kFusedPredictMax + 1, -7));
  TANDEM_ASSERT_CUDA(cudaMemset(predict.as<int32_t>() + kFusedPredictMax, 0, sizeof(int32_t)));
  DeviceBuffer next_logits = testing::Upload(std::vector<float>(static_cast<size_t>(kE), 0.0f));
  // Ids this layer "was predicted": valid and not, the kernel must only prefetch the valid ones.
  std::vector<int32_t> told(kPredict);
  for (int i = 0; i < kPredict; ++i) told[static_cast<size_t>(i)] = i % 3 == 0 ? -5 : i % 3 == 1 ? 7 * i : 100000;
  const DeviceBuffer dtold = testing::Upload(told);
  cudaStream_t stream = nullptr;
  TANDEM_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  auto run = [&](bool predicting, std::vector<int32_t>* picks) {
    OneTokenStep step(ex, kK, std::vector<float>(static_cast<size_t>(kE), 0.0f), x,
                      std::vector<float>(static_cast<size_t>(kH), 0.0f), 0.0f);
    OneTokenMoeArgs a = step.Args(ex, kK, Shared::kNone);
    a.int16_activations = true;
    a.logit_route = true;
    EXPECT_EQ(cudaMemset(step.y.get(), 0, static_cast<size_t>(kH) * sizeof(float)), cudaSuccess);
    FusedRouter router{dw.as<float>(), static_cast<int>(kE), step.logits.as<float>(), counters.as<int32_t>()};
    if (predicting) {
      router.next_w = dnext.as<float>();
      router.next_logits = next_logits.as<float>();
      router.next_count = predict.as<int32_t>() + kFusedPredictMax;
      router.next_pred = predict.as<int32_t>();
      router.predict = kPredict;
      a.pred = dtold.as<int32_t>();
      a.predict = kPredict;
    }
    EXPECT_EQ(LaunchOneTokenMoeFused(a, nullptr, stream, &router), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(Download<int32_t>(counters.get(), 2), std::vector<int32_t>(2, 0));
    *picks = Download<int32_t>(step.picks.get(), static_cast<size_t>(kK));
    EXPECT_EQ(Download<int32_t>(step.ints.get(), 1)[0], 0) << "error flag";
    return Download<float>(step.y.get(), static_cast<size_t>(kH));
  };
  std::vector<int32_t> picks0;
  const std::vector<float> y0 = run(false, &picks0);
  std::vector<int32_t> picks;
  const std::vector<float> y = run(true, &picks);
  EXPECT_EQ(picks, picks0);
  EXPECT_LE(testing::RelativeL2(y, y0), 1e-6);  // only the atomics' order
  const std::vector<int32_t> got = Download<int32_t>(predict.get(), kFusedPredictMax + 1);
  EXPECT_EQ(got[kFusedPredictMax], 0) << "the count is left zero";
  std::set<int32_t> distinct;
  for (int i = 0; i < kPredict; ++i) {
    const int32_t id = got[static_cast<size_t>(i)];
    ASSERT_TRUE(id >= 0 && id < kE) << i << ": " << id;
    distinct.insert(id);
    // The i-th largest (f32 sums in another order than the f64 reference: near ties may swap).
    EXPECT_NEAR(want[static_cast<size_t>(id)], sorted[static_cast<size_t>(i)], 1e-4) << "rank " << i;
  }
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kPredict));
  EXPECT_EQ(got[kPredict], -7) << "nothing written past the predicted ids";
  std::printf("predicted the next layer's top %d; y relative L2 to no prediction %.2e\n", kPredict,
              testing::RelativeL2(y, y0));
  TANDEM_ASSERT_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace tandem::cuda
