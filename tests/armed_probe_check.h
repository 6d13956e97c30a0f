// Shared by the tests of the in-step probes' armed buffers (attention_probe_test.cc,
// dense_colsplit_test.cc, gdn_decode_out_probe_test.cc, tests/gpu_moe/expert_decode_fused_test.cc):
// the decode-step probe switched on for a scope, and the check that a launch's blocks each took one
// row of the buffer.
#ifndef TANDEM_TESTS_ARMED_PROBE_CHECK_H_
#define TANDEM_TESTS_ARMED_PROBE_CHECK_H_

#include <cstddef>
#include <vector>

#include "gpu_service/backends/cuda/step_probe.h"
#include "gtest/gtest.h"

namespace tandem::testing {

// cuda::ProbeDecodeStep() set to `on` for the object's life, then back to what it was.
class ScopedProbeDecodeStep {
 public:
  explicit ScopedProbeDecodeStep(bool on) : was_(cuda::ProbeDecodeStep()) { cuda::SetProbeDecodeStep(on); }
  ~ScopedProbeDecodeStep() { cuda::SetProbeDecodeStep(was_); }
  ScopedProbeDecodeStep(const ScopedProbeDecodeStep&) = delete;
  ScopedProbeDecodeStep& operator=(const ScopedProbeDecodeStep&) = delete;

 private:
  bool was_;
};

// The rows an armed buffer (rows of `words` words, zeroed before the launch) holds after one launch
// of `blocks` blocks: rows [0, blocks) each name a different block below `blocks` (block_of(row)),
// and row_check(block, row) checks the row's own words; every word of the rows past them is zero.
template <class BlockOf, class RowCheck>
void ExpectEveryBlockOnce(const std::vector<unsigned long long>& rows, size_t words, int blocks, BlockOf block_of,
                          RowCheck row_check) {
  ASSERT_GE(rows.size(), static_cast<size_t>(blocks) * words);
  std::vector<int> seen(static_cast<size_t>(blocks), 0);
  for (size_t i = 0; i < static_cast<size_t>(blocks); ++i) {
    const unsigned long long* row = rows.data() + i * words;
    const unsigned long long b = block_of(row);
    ASSERT_LT(b, static_cast<unsigned long long>(blocks)) << "row " << i;
    ++seen[static_cast<size_t>(b)];
    row_check(static_cast<int>(b), row);
  }
  for (int b = 0; b < blocks; ++b) EXPECT_EQ(seen[static_cast<size_t>(b)], 1) << "block " << b;
  for (size_t w = static_cast<size_t>(blocks) * words; w < rows.size(); ++w) {
    ASSERT_EQ(rows[w], 0u) << "row " << w / words << " past the launch's blocks, word " << w % words;
  }
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_ARMED_PROBE_CHECK_H_
