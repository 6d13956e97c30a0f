#include "common/model/sampler.h"

#include <algorithm>
#include <cmath>

namespace tandem {

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) return Argmax(logits);
  // Candidates sorted by logit (descending, ties to the lower id), then filtered.
  scratch_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) scratch_[i] = {logits[i], static_cast<int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = scratch_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    n = params_.top_k;
    std::partial_sort(scratch_.begin(), scratch_.begin() + n, scratch_.end(), by_logit);
  } else {
    std::sort(scratch_.begin(), scratch_.end(), by_logit);
  }
  // Softmax at the temperature over the kept candidates (f64 for a stable sum).
  std::vector<double> p(n);
  const double max_logit = scratch_[0].first;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::exp((scratch_[i].first - max_logit) / params_.temperature);
    sum += p[i];
  }
  for (double& v : p) v /= sum;
  if (params_.min_p > 0.0f) {
    const double floor = params_.min_p * p[0];
    size_t keep = 1;
    while (keep < n && p[keep] >= floor) ++keep;
    n = keep;
  }
  if (params_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += p[keep++];
      if (cum >= params_.top_p) break;
    }
    n = keep;
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += p[i];
  // 53 random bits -> a uniform double in [0, total).
  const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += p[i];
    if (u < cum) return scratch_[i].second;
  }
  return scratch_[n - 1].second;
}

}  // namespace tandem
