// TANDEM_DECODE_ABLATE's names (decode_ablation.h): a measuring tool, so what matters is that a
// typo is reported instead of silently timing the full step.
#include "gpu_service/backends/cuda/backend/decode_ablation.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>

namespace tandem::cuda {
namespace {

unsigned Bits(std::initializer_list<Ablate> what) {
  unsigned m = 0;
  for (Ablate a : what) m |= static_cast<unsigned>(a);
  return m;
}

TEST(DecodeAblationTest, ParsesEveryName) {
  const DecodeAblation all =
      ParseDecodeAblation("mixer_norm,ffn_norm,mixer,gdn_in,gdn_core,gdn_out,router,shared,moe");
  EXPECT_EQ(all.mask, Bits({Ablate::kMixerNorm, Ablate::kFfnNorm, Ablate::kMixer, Ablate::kGdnIn, Ablate::kGdnCore,
                            Ablate::kGdnOut, Ablate::kRouter, Ablate::kShared, Ablate::kMoe}));
  EXPECT_TRUE(all.unknown.empty());
}

TEST(DecodeAblationTest, ReportsUnknownNamesAndSkipsEmptyItems) {
  const DecodeAblation d = ParseDecodeAblation(",router,,rooter,moe,");
  EXPECT_EQ(d.mask, Bits({Ablate::kRouter, Ablate::kMoe}));
  ASSERT_EQ(d.unknown.size(), 1u);
  EXPECT_EQ(d.unknown[0], "rooter");
  EXPECT_EQ(ParseDecodeAblation("").mask, 0u);
  EXPECT_EQ(ParseDecodeAblation("Router").mask, 0u);  // names are case-sensitive
}

TEST(DecodeAblationTest, LeavesOnlyOneTokenStepsOut) {
  // Unset in the test environment: nothing is left out whatever the step.
  if (std::getenv("TANDEM_DECODE_ABLATE") != nullptr) GTEST_SKIP() << "TANDEM_DECODE_ABLATE is set";
  EXPECT_FALSE(Ablated(Ablate::kMoe, 1));
  EXPECT_FALSE(Ablated(Ablate::kMoe, 8));
}

}  // namespace
}  // namespace tandem::cuda
