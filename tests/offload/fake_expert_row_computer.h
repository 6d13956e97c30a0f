// A deterministic stand-in for the expert kernels, for the channel tests:
//   out[j] = expert + x[row][j] * (layer + 1) + (exact ? 0.5 : 0)
// so every output row reveals which expert, row, layer and mode the worker used.
#ifndef TANDEM_TESTS_OFFLOAD_FAKE_EXPERT_ROW_COMPUTER_H_
#define TANDEM_TESTS_OFFLOAD_FAKE_EXPERT_ROW_COMPUTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/offload/model_fingerprint.h"
#include "host_expert_worker/channel/expert_row_computer.h"

namespace tandem {

inline float FakeExpertOutput(uint32_t expert, uint32_t layer, bool exact, float x) {
  return static_cast<float>(expert) + x * static_cast<float>(layer + 1) + (exact ? 0.5f : 0.0f);
}

// The fingerprint of a fake model's expert tensors; a non-zero salt makes a different model.
inline uint64_t FakeModelFingerprint(uint32_t layers, uint32_t experts, uint32_t hidden,
                                     uint32_t salt = 0) {
  std::vector<FingerprintTensor> tensors;
  constexpr int64_t kFeedForward = 64;
  for (uint32_t l = 0; l < layers; ++l) {
    const std::string blk = absl::StrCat("blk.", l, ".");
    tensors.push_back({blk + "ffn_gate_exps.weight", 12, {hidden, kFeedForward, experts}});
    tensors.push_back({blk + "ffn_up_exps.weight", 12, {hidden, kFeedForward, experts}});
    tensors.push_back({blk + "ffn_down_exps.weight", 14, {kFeedForward, hidden, experts}});
  }
  if (salt != 0) tensors.push_back({absl::StrCat("salt.", salt), 0, {1}});
  return ModelFingerprint(tensors);
}

class FakeExpertRowComputer : public ExpertRowComputer {
 public:
  explicit FakeExpertRowComputer(const ExpertModelShape& shape) : shape_(shape) {}
  const ExpertModelShape& shape() const override { return shape_; }
  absl::Status Compute(const ExpertBatch& batch, float* outputs) override {
    for (size_t i = 0; i < batch.pairs.size(); ++i) {
      const float* x = batch.activations + size_t{batch.pairs[i].row} * batch.hidden_size;
      float* out = outputs + i * batch.hidden_size;
      for (uint32_t j = 0; j < batch.hidden_size; ++j) {
        out[j] = FakeExpertOutput(batch.pairs[i].expert, batch.layer, batch.exact, x[j]);
      }
    }
    return absl::OkStatus();
  }

 private:
  ExpertModelShape shape_;
};

}  // namespace tandem

#endif  // TANDEM_TESTS_OFFLOAD_FAKE_EXPERT_ROW_COMPUTER_H_
