// Parity of GPU sampling with the CPU Sampler (common/model/sampler.h): the same uniform number
// (drawn here exactly as Sampler draws it from the request's seed) must pick the same token.
#include <random>
#include <vector>

#include "common/model/sampler.h"
#include "gpu_service/backends/cuda/kernels/sampling_plan.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::Upload;

class GpuSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// Logits with ties: every value is rounded to a coarse grid so that many ids share a logit.
std::vector<float> TiedLogits(std::mt19937& rng, int rows, int vocab) {
  std::vector<float> l = Random(rng, static_cast<size_t>(rows) * vocab, 2.0f);
  for (float& v : l) v = std::round(v * 16.0f) / 16.0f;
  return l;
}

TEST_F(GpuSamplingTest, GreedyIsArgmaxWithTiesToLowerId) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int rows = 5, vocab = 15013;
  const std::vector<float> logits = TiedLogits(rng, rows, vocab);
  auto sampler = cuda::GpuSampler::Create(rows, vocab);
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  auto d_logits = Upload(logits);
  auto d_tokens = Poisoned<int32_t>(rows);
  ASSERT_TRUE((*sampler)->Greedy(d_logits.get(), rows, d_tokens.get(), nullptr).ok());
  const std::vector<int32_t> got = Download(d_tokens);
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(got[r], Argmax(std::span<const float>(logits.data() + static_cast<size_t>(r) * vocab, vocab)))
        << "row " << r;
  }
}

TEST_F(GpuSamplingTest, TemperatureTopKTopPMinPMatchCpuSampler) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int vocab = 20011;
  const std::vector<SamplingParams> cases = {
      {0.0f, 0, 1.0f, 0.0f, 1},   {0.7f, 0, 1.0f, 0.0f, 2},  {1.0f, 40, 1.0f, 0.0f, 3},
      {0.8f, 0, 0.9f, 0.0f, 4},   {1.3f, 50, 0.8f, 0.0f, 5}, {1.0f, 0, 1.0f, 0.05f, 6},
      {0.6f, 100, 0.95f, 0.02f, 7}, {2.0f, 1, 0.5f, 0.0f, 8},
  };
  const int rows = static_cast<int>(cases.size());
  auto sampler = cuda::GpuSampler::Create(rows, vocab);
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  for (int round = 0; round < 4; ++round) {
    const std::vector<float> logits = TiedLogits(rng, rows, vocab);
    std::vector<cuda::SamplingRowParams> params(static_cast<size_t>(rows));
    std::vector<int32_t> want(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      SamplingParams p = cases[r];
      p.seed = rng();
      Sampler cpu(p);
      want[r] = cpu.Sample(std::span<const float>(logits.data() + static_cast<size_t>(r) * vocab, vocab));
      std::mt19937_64 draw(p.seed);  // Sampler's first draw, reproduced
      params[r] = {p.temperature, p.top_k, p.top_p, p.min_p,
                   static_cast<double>(draw() >> 11) * (1.0 / 9007199254740992.0)};
    }
    auto d_logits = Upload(logits);
    auto d_params = Upload(params);
    auto d_tokens = Poisoned<int32_t>(rows);
    ASSERT_TRUE((*sampler)->Sample(d_logits.get(), rows, d_params.get(), d_tokens.get(), nullptr).ok());
    EXPECT_EQ(Download(d_tokens), want) << "round " << round;
  }
}

}  // namespace
}  // namespace tandem
