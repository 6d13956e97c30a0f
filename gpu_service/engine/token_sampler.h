// Per-request token selection: penalties, then the common Sampler (temperature, top-k, top-p,
// min-p with a per-request seeded generator), and log-probabilities with top-n alternatives.
//
// Determinism: one TokenSampler per request, fed only that request's logits and tokens, so a
// seeded request picks the same tokens whether it runs alone or batched with others (as long as
// the backend's logits for it are the same).
#ifndef TANDEM_GPU_SERVICE_ENGINE_TOKEN_SAMPLER_H_
#define TANDEM_GPU_SERVICE_ENGINE_TOKEN_SAMPLER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/model/sampler.h"
#include "gpu_service/engine/generation_request.h"

namespace tandem {

class TokenSampler {
 public:
  // `prompt` seeds the repetition penalty's token set; `seed` is the generator's seed.
  TokenSampler(const SamplingOptions& options, uint64_t seed, std::span<const int32_t> prompt);

  // Picks the next token from `logits` (vocab floats, unchanged) and records it as generated.
  // With want_logprobs, fills logprob and up to top_n alternatives from the log-softmax of the
  // penalised logits (before temperature). Tokens in `banned` cannot be picked (min_new_tokens
  // keeps EOS and stop tokens out this way); their logprob is -inf.
  TokenOutput Next(std::span<const float> logits, bool want_logprobs, int32_t top_n,
                   std::span<const int32_t> banned = {});

 private:
  bool has_penalties() const;

  SamplingOptions options_;
  Sampler sampler_;
  absl::flat_hash_map<int32_t, int32_t> seen_;       // prompt and generated tokens (repetition)
  absl::flat_hash_map<int32_t, int32_t> generated_;  // generated token -> count
  std::vector<float> scratch_;
};

// Log-softmax of `logits` at `index` and the top_n best (id, logprob), best first (ties: lower id).
float LogSoftmaxAt(std::span<const float> logits, int32_t index);
std::vector<TopTokenOutput> TopLogprobs(std::span<const float> logits, int32_t top_n);

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_ENGINE_TOKEN_SAMPLER_H_
