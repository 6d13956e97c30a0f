#include "common/reference/mtp.h"

#include <vector>

#include "gtest/gtest.h"
#include "tests/reference/test_util.h"

namespace tandem {
namespace {

using testing::NaiveMatVec;
using testing::NaiveRmsNorm;
using testing::RandomVector;
using testing::RelativeL2;

// H'_s = eh_proj[h:2h cols]·(hnorm_s ⊙ ρ(hsrc_s)) + eh_proj[0:h cols]·(enorm ⊙ ρ(embd)), with the
// two column halves applied separately in the test.
TEST(MtpTest, MixesEmbeddingAndHiddenHalves) {
  std::mt19937 rng(61);
  const int64_t S = 3, h = 10, n = 2;
  const float eps = 1e-6f;
  const std::vector<float> eh = RandomVector(rng, 2 * h * h, 0.3f);
  const std::vector<float> enorm = RandomVector(rng, h, 0.2f, 1.0f);
  const std::vector<float> hnorm = RandomVector(rng, S * h, 0.2f, 1.0f);
  const MtpInputWeights w{F32Matrix(eh.data(), 2 * h, h), enorm, hnorm};
  ASSERT_TRUE(CheckMtpInputWeights(w, S, h).ok());
  const std::vector<float> hsrc = RandomVector(rng, n * S * h);
  const std::vector<float> embd = RandomVector(rng, n * h);
  std::vector<float> out(static_cast<size_t>(n * S * h));
  MtpMixInputs(w, hsrc.data(), embd.data(), n, S, h, eps, out.data(), nullptr);

  // The column halves as separate {h, h} matrices.
  std::vector<float> left(static_cast<size_t>(h * h)), right(left.size());
  for (int64_t r = 0; r < h; ++r) {
    for (int64_t c = 0; c < h; ++c) {
      left[r * h + c] = eh[r * 2 * h + c];
      right[r * h + c] = eh[r * 2 * h + h + c];
    }
  }
  std::vector<float> ref;
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<double> e = NaiveRmsNorm(embd.data() + t * h, h, eps, enorm.data());
    const std::vector<double> from_embd = NaiveMatVec(left, h, h, e.data());
    for (int64_t s = 0; s < S; ++s) {
      const std::vector<double> hs = NaiveRmsNorm(hsrc.data() + (t * S + s) * h, h, eps, hnorm.data() + s * h);
      const std::vector<double> from_hidden = NaiveMatVec(right, h, h, hs.data());
      for (int64_t j = 0; j < h; ++j) ref.push_back(static_cast<float>(from_embd[j] + from_hidden[j]));
    }
  }
  EXPECT_LE(RelativeL2(out, ref), 1e-6);
}

}  // namespace
}  // namespace tandem
