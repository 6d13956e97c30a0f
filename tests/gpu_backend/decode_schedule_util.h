// Shared by the decode schedule tests (decode_schedule_test.cc: switches that must leave the
// logits bit-identical or within f32 tolerance; decode_fast_switch_test.cc: fast-mode switches that
// change the one-token kernels' rounding): decode logits of a preset under a switch, the two
// comparisons, and the suite's fixture, one suite over both files (instantiated in
// decode_schedule_test.cc).
#ifndef TANDEM_TESTS_GPU_BACKEND_DECODE_SCHEDULE_UTIL_H_
#define TANDEM_TESTS_GPU_BACKEND_DECODE_SCHEDULE_UTIL_H_

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/gpu_backend/backend_test_open.h"
#include "tests/gpu_backend/backend_test_util.h"

namespace tandem {
namespace decode_schedule_testing {

using gpu_backend_testing::MaxRowError;
using gpu_backend_testing::PresetModel;
using gpu_backend_testing::RandomTokens;

// Logits of a prompt per sequence, then `steps` decode steps of all `batch` sequences together
// (tokens fixed by the step and the sequence), in one vector: the decode rows in order. picks (when
// set) receives every decode step's MoE picks, layer by layer (the routing sink: those steps run
// without graphs).
inline std::vector<float> DecodeLogits(const std::string& path, CudaMode mode, int batch, int steps,
                                       std::vector<int32_t>* picks = nullptr) {
  CudaBackendOptions o;
  o.mode = mode;
  o.max_batch_tokens = 64;
  o.max_sequences = 4;
  o.max_context = 128;
  absl::StatusOr<std::unique_ptr<CudaBackend>> b = CudaBackend::Open(path, o);
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return {};
  CudaBackend& backend = **b;
  const int64_t V = backend.config().vocab;
  std::vector<SequenceSlot> seqs;
  std::vector<float> prompt_logits(static_cast<size_t>(V));
  for (int i = 0; i < batch; ++i) {
    absl::StatusOr<SequenceSlot> s = backend.CreateSequence();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return {};
    seqs.push_back(*s);
    const std::vector<int32_t> prompt = RandomTokens(17 + 5 * i, V, 90 + static_cast<uint32_t>(i));
    const Backend::StepInput in{*s, prompt, prompt_logits.data(), false};
    EXPECT_TRUE(backend.Step(std::span<const Backend::StepInput>(&in, 1)).ok());
  }
  std::vector<float> out(static_cast<size_t>(steps) * batch * V);
  std::vector<int32_t> toks(static_cast<size_t>(batch));
  for (int step = 0; step < steps; ++step) {
    std::vector<Backend::StepInput> in;
    for (int i = 0; i < batch; ++i) {
      toks[i] = static_cast<int32_t>((7 + 13 * step + 29 * i) % V);
      in.push_back({seqs[i], std::span<const int32_t>(&toks[i], 1),
                    out.data() + (static_cast<size_t>(step) * batch + i) * V, false});
    }
    std::vector<MoeRouting> routing;
    if (picks != nullptr) backend.set_routing_sink(&routing);
    const absl::Status s = backend.Step(in);
    EXPECT_TRUE(s.ok()) << s;
    if (picks != nullptr) {
      backend.set_routing_sink(nullptr);
      for (const MoeRouting& r : routing) picks->insert(picks->end(), r.experts.begin(), r.experts.end());
    }
  }
  return out;
}

// Runs DecodeLogits with `set(false)` and with `set(true)` and expects the same bits (tolerance 0)
// or rows of logits within `tolerance` relative L2 (the caller restores the switch).
inline void ExpectScheduleChangesNoLogits(const std::string& preset, const char* what,
                                          const std::function<void(bool)>& set, double tolerance = 0) {
  absl::StatusOr<std::string> path = PresetModel(preset);
  ASSERT_TRUE(path.ok()) << path.status();
  constexpr int kSteps = 6;
  for (CudaMode mode : {CudaMode::kExact, CudaMode::kFast}) {
    for (int batch : {1, 3}) {
      std::vector<float> logits[2];
      for (int on = 0; on < 2; ++on) {
        set(on == 1);
        logits[on] = DecodeLogits(*path, mode, batch, kSteps);
      }
      ASSERT_EQ(logits[0].size(), logits[1].size());
      ASSERT_FALSE(logits[0].empty());
      const bool same = std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)) == 0;
      const double err = MaxRowError(logits[1], logits[0], static_cast<int64_t>(logits[0].size() / (kSteps * batch)));
      printf("[%s] %s decode, batch %d, %s: %s (max row relative L2 %.3g)\n", preset.c_str(),
             mode == CudaMode::kExact ? "exact" : "fast", batch, what, same ? "bit-identical" : "DIFFERENT", err);
      if (tolerance == 0) {
        EXPECT_TRUE(same) << what << ", batch " << batch;
      } else {
        EXPECT_LE(err, tolerance) << what << ", batch " << batch;
      }
    }
  }
}

// Eager decode steps (the routing sink records the picks) of `preset` with `set(false)` and
// `set(true)`, exact and fast, batch 1 and 3: the same picks and bit-identical logits. Prints `what`.
inline void ExpectEagerPicksAndLogitsUnchanged(const std::string& preset, const char* what,
                                               const std::function<void(bool)>& set) {
  absl::StatusOr<std::string> path = PresetModel(preset);
  ASSERT_TRUE(path.ok()) << path.status();
  for (CudaMode mode : {CudaMode::kExact, CudaMode::kFast}) {
    for (int batch : {1, 3}) {
      std::vector<int32_t> picks[2];
      std::vector<float> logits[2];
      for (int on = 0; on < 2; ++on) {
        set(on == 1);
        logits[on] = DecodeLogits(*path, mode, batch, 4, &picks[on]);
      }
      ASSERT_FALSE(picks[0].empty());
      ASSERT_EQ(logits[0].size(), logits[1].size());
      const bool same_logits = std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)) == 0;
      printf("[%s] %s eager decode, batch %d, %s: picks %s, logits %s\n", preset.c_str(),
             mode == CudaMode::kExact ? "exact" : "fast", batch, what, picks[0] == picks[1] ? "same" : "DIFFERENT",
             same_logits ? "bit-identical" : "DIFFERENT");
      EXPECT_EQ(picks[0], picks[1]) << what << ", batch " << batch;
      EXPECT_TRUE(same_logits) << what << ", batch " << batch;
    }
  }
}

}  // namespace decode_schedule_testing

// The presets' decode schedule tests (tiny-q3n, small), over decode_schedule_test.cc and
// decode_fast_switch_test.cc.
class DecodeScheduleTest : public ::testing::TestWithParam<std::string> {};

}  // namespace tandem

#endif  // TANDEM_TESTS_GPU_BACKEND_DECODE_SCHEDULE_UTIL_H_
