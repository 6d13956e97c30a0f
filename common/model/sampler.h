// Token sampling from logits: greedy, temperature, top-k, top-p, min-p, with a per-sequence seeded
// generator so that a seeded request gives the same tokens alone or in a batch.
#ifndef TANDEM_COMMON_MODEL_SAMPLER_H_
#define TANDEM_COMMON_MODEL_SAMPLER_H_

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace tandem {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, ties to the lower id)
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  // Picks a token from the logits (vocab floats).
  int32_t Sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;  // mt19937_64's output sequence is fixed by the standard
  std::vector<std::pair<float, int32_t>> scratch_;
};

// The index of the largest logit (ties: the lower index).
int32_t Argmax(std::span<const float> logits);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_SAMPLER_H_
