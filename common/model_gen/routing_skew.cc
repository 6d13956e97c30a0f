#include "common/model_gen/routing_skew.h"

#include <cmath>

#include "common/model_gen/gen_random.h"

namespace tandem {

std::vector<float> SkewDirection(const GenModelSpec& spec) {
  GenRandom rng(StreamSeed(spec.seed, "routing.direction"));
  std::vector<float> s(spec.h);
  for (float& v : s) v = (rng.Next() >> 63) ? 1.0f : -1.0f;
  return s;
}

std::vector<double> TargetLogitShifts(const GenModelSpec& spec, int64_t layer) {
  std::vector<double> shift(spec.experts, 0.0);
  if (spec.zipf <= 0) return shift;
  const std::vector<int64_t> ranks = ExpertPopularityRanks(spec, layer);
  double mean = 0;
  for (int64_t r : ranks) mean += std::log(static_cast<double>(r));
  mean /= static_cast<double>(spec.experts);
  for (int64_t e = 0; e < spec.experts; ++e) {
    shift[e] = -spec.zipf * (std::log(static_cast<double>(ranks[e])) - mean);
  }
  return shift;
}

std::vector<float> RouterSkewCoefficients(const GenModelSpec& spec, int64_t layer) {
  const std::vector<double> shift = TargetLogitShifts(spec, layer);
  // The router input is x ≈ ρ(H) (norm weights ≈ 1). Its projection on u = s/√h is about
  // μ·√h / rms(H), with rms(H)² ≈ 1 + μ² + growth·layer. A row term c·u moves the logit by
  // c·⟨u, x⟩, so c = shift / projection.
  const double mu = kSkewEmbeddingOffset;
  const double rms = std::sqrt(1.0 + mu * mu + kSkewResidualGrowthPerLayer * static_cast<double>(layer));
  const double projection = mu * std::sqrt(static_cast<double>(spec.h)) / rms;
  std::vector<float> c(spec.experts);
  for (int64_t e = 0; e < spec.experts; ++e) c[e] = static_cast<float>(shift[e] / projection);
  return c;
}

}  // namespace tandem
