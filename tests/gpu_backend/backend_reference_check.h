// What the CUDA backend's end-to-end tests (cuda_backend_test.cc: exact mode; cuda_backend_fast_test.cc:
// fast mode) share: their prompt length, the CPU reference's logits of a whole prompt, and the
// comparison of two id lists as sets. Test code (gtest).
#ifndef TANDEM_TESTS_GPU_BACKEND_BACKEND_REFERENCE_CHECK_H_
#define TANDEM_TESTS_GPU_BACKEND_BACKEND_REFERENCE_CHECK_H_

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "common/model/reference_model.h"
#include "gtest/gtest.h"

namespace tandem::gpu_backend_testing {

inline constexpr int64_t kPrompt = 64;  // the tests' prompt tokens

// Whether two lists hold the same ids, in any order (routing picks, block selections).
inline bool SameIds(std::vector<int32_t> a, std::vector<int32_t> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

// Logits of every position of `tokens` from one reference Forward; routing, block-selection
// margins and block selections when asked.
inline std::vector<float> ReferencePrefill(ReferenceModel& m, SequenceState* seq, const std::vector<int32_t>& tokens,
                                           std::vector<MoeRouting>* routing = nullptr,
                                           std::vector<std::vector<float>>* select_margins = nullptr,
                                           std::vector<BlockSelection>* selections = nullptr) {
  std::vector<float> logits(tokens.size() * m.config().vocab);
  ReferenceModel::Step step{seq, tokens, logits.data(), true};
  ReferenceModel::ForwardOptions fo;
  fo.routing = routing;
  fo.select_margins = select_margins;
  fo.selections = selections;
  EXPECT_TRUE(m.Forward(std::span<ReferenceModel::Step>(&step, 1), fo).ok());
  return logits;
}

}  // namespace tandem::gpu_backend_testing

#endif  // TANDEM_TESTS_GPU_BACKEND_BACKEND_REFERENCE_CHECK_H_
