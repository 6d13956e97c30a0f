#include "common/reference/streams.h"

#include <vector>

#include "gtest/gtest.h"
#include "tests/reference/test_util.h"

namespace tandem {
namespace {

using testing::NaiveMatVec;
using testing::NaiveRmsNorm;
using testing::NaiveSigmoid;
using testing::NaiveSilu;
using testing::RandomVector;

constexpr float kEps = 1e-6f;

TEST(StreamsTest, PlainReadIsRmsNormTimesGamma) {
  std::mt19937 rng(11);
  const int64_t h = 48, n = 3;
  const std::vector<float> H = RandomVector(rng, n * h, 2.0f);
  const std::vector<float> gamma = RandomVector(rng, h, 0.3f, 1.0f);
  HcWeights w;
  w.norm = gamma;
  ASSERT_TRUE(CheckHcWeights(w, 1, h).ok());
  std::vector<float> x(static_cast<size_t>(n * h)), a(static_cast<size_t>(n), -1.0f);
  StreamRead(w, H.data(), n, 1, h, kEps, x.data(), a.data(), nullptr);
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<double> ref = NaiveRmsNorm(H.data() + t * h, h, kEps, gamma.data());
    for (int64_t j = 0; j < h; ++j) ASSERT_NEAR(x[t * h + j], ref[j], 1e-6 * (1 + std::fabs(ref[j])));
    EXPECT_EQ(a[t], 1.0f);
  }
  EXPECT_FALSE(CheckHcWeights(w, 2, h).ok());  // two streams need the hc matrices
}

// The whole §4.1 read, written plainly in f64.
void NaiveRead(const std::vector<float>& H, int64_t S, int64_t h, int64_t lr, const std::vector<float>& gamma,
               const std::vector<float>& down, const std::vector<float>& up, const std::vector<float>* inject,
               int64_t t, std::vector<double>& x, std::vector<double>& a) {
  const int64_t width = S * h;
  std::vector<double> N(static_cast<size_t>(width));
  for (int64_t s = 0; s < S; ++s) {
    const std::vector<double> ns = NaiveRmsNorm(H.data() + t * width + s * h, h, kEps, gamma.data() + s * h);
    std::copy(ns.begin(), ns.end(), N.begin() + s * h);
  }
  std::vector<double> z = NaiveMatVec(down, width, lr, N.data());
  for (double& v : z) v = NaiveSilu(v);
  const std::vector<double> m = NaiveMatVec(up, lr, width, z.data());
  x.assign(static_cast<size_t>(h), 0.0);
  for (int64_t j = 0; j < h; ++j) {
    for (int64_t s = 0; s < S; ++s) x[j] += NaiveSigmoid(m[s * h + j]) * N[s * h + j];
    x[j] *= 2.0 / S;
  }
  a.assign(static_cast<size_t>(S), 1.0);
  if (inject != nullptr) {
    const std::vector<double> c = NaiveMatVec(*inject, width, S, N.data());
    for (int64_t s = 0; s < S; ++s) a[s] = 2.0 * NaiveSigmoid(c[s]);
  }
}

TEST(StreamsTest, MultiStreamReadMatchesNaive) {
  std::mt19937 rng(12);
  for (bool with_inject : {false, true}) {
    const int64_t S = 4, h = 32, lr = 8, n = 5, width = S * h;
    const std::vector<float> H = RandomVector(rng, n * width);
    const std::vector<float> gamma = RandomVector(rng, width, 0.2f, 1.0f);
    const std::vector<float> down = RandomVector(rng, width * lr, 0.1f);
    const std::vector<float> up = RandomVector(rng, lr * width, 0.5f);
    const std::vector<float> inject = RandomVector(rng, width * S, 0.1f);
    HcWeights w;
    w.norm = gamma;
    w.down = F32Matrix(down.data(), width, lr);
    w.up = F32Matrix(up.data(), lr, width);
    if (with_inject) w.inject = F32Matrix(inject.data(), width, S);
    ASSERT_TRUE(CheckHcWeights(w, S, h).ok());
    std::vector<float> x(static_cast<size_t>(n * h)), a(static_cast<size_t>(n * S));
    ThreadPool pool(2);
    StreamRead(w, H.data(), n, S, h, kEps, x.data(), a.data(), &pool);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> rx, ra;
      NaiveRead(H, S, h, lr, gamma, down, up, with_inject ? &inject : nullptr, t, rx, ra);
      for (int64_t j = 0; j < h; ++j) ASSERT_NEAR(x[t * h + j], rx[j], 2e-6 * (1 + std::fabs(rx[j])));
      for (int64_t s = 0; s < S; ++s) ASSERT_NEAR(a[t * S + s], ra[s], 1e-6);
    }
  }
}

TEST(StreamsTest, InjectAddsWeightedOutputToEveryStream) {
  const int64_t n = 2, S = 2, h = 3;
  std::vector<float> H = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<float> a = {1.0f, 0.5f, 2.0f, 0.0f};
  const std::vector<float> y = {1, 1, 1, -1, 0, 1};
  StreamInject(H.data(), n, S, h, a.data(), y.data());
  const std::vector<float> expected = {2, 3, 4, 4.5f, 5.5f, 6.5f, 5, 8, 11, 10, 11, 12};
  EXPECT_EQ(H, expected);
}

}  // namespace
}  // namespace tandem
