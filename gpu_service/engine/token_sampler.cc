#include "gpu_service/engine/token_sampler.h"

#include <algorithm>
#include <cmath>

namespace tandem {
namespace {

SamplingParams CommonParams(const SamplingOptions& o, uint64_t seed) {
  SamplingParams p;
  p.temperature = o.temperature;
  p.top_k = o.top_k;
  p.top_p = o.top_p;
  p.min_p = o.min_p;
  p.seed = seed;
  return p;
}

// log Σ exp(logits), stable.
double LogSumExp(std::span<const float> logits) {
  float max = -INFINITY;
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  return max + std::log(sum);
}

}  // namespace

float LogSoftmaxAt(std::span<const float> logits, int32_t index) {
  return static_cast<float>(logits[index] - LogSumExp(logits));
}

std::vector<TopTokenOutput> TopLogprobs(std::span<const float> logits, int32_t top_n) {
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(top_n, 0)), logits.size());
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double lse = LogSumExp(logits);
  std::vector<TopTokenOutput> top(n);
  for (size_t i = 0; i < n; ++i) {
    top[i] = TopTokenOutput{ids[i], static_cast<float>(logits[ids[i]] - lse)};
  }
  return top;
}

TokenSampler::TokenSampler(const SamplingOptions& options, uint64_t seed,
                           std::span<const int32_t> prompt)
    : options_(options), sampler_(CommonParams(options, seed)) {
  if (options_.repetition_penalty != 1.0f) {
    for (int32_t id : prompt) ++seen_[id];
  }
}

bool TokenSampler::has_penalties() const {
  return options_.repetition_penalty != 1.0f || options_.presence_penalty != 0.0f ||
         options_.frequency_penalty != 0.0f;
}

TokenOutput TokenSampler::Next(std::span<const float> logits, bool want_logprobs, int32_t top_n,
                               std::span<const int32_t> banned) {
  std::span<const float> used = logits;
  if (has_penalties() || !banned.empty()) {
    scratch_.assign(logits.begin(), logits.end());
    for (int32_t id : banned) {
      if (id >= 0 && static_cast<size_t>(id) < scratch_.size()) scratch_[id] = -INFINITY;
    }
    if (options_.repetition_penalty != 1.0f) {
      const float r = options_.repetition_penalty;
      for (const auto& [id, count] : seen_) {
        float& v = scratch_[id];
        v = v > 0 ? v / r : v * r;
      }
    }
    for (const auto& [id, count] : generated_) {
      scratch_[id] -= options_.presence_penalty + options_.frequency_penalty * count;
    }
    used = scratch_;
  }
  TokenOutput out;
  out.id = sampler_.Sample(used);
  if (want_logprobs) {
    out.logprob = LogSoftmaxAt(used, out.id);
    if (top_n > 0) out.top = TopLogprobs(used, top_n);
  }
  if (options_.repetition_penalty != 1.0f) ++seen_[out.id];
  ++generated_[out.id];
  return out;
}

}  // namespace tandem
