// Skewed expert routing for synthetic models (docs/GEN_MODEL.md, "Skewed routing").
//
// Random routers pick experts about uniformly. To make expert popularity follow a Zipf law, the
// generator gives every token embedding a common component μ·s (s a fixed ±1 sign pattern) and
// adds to each router row a multiple of s chosen so that the expert's logit moves by
// −zipf·ln(rank) on a typical token. With Gaussian router noise of about unit spread, the top-K
// picks then favour low ranks roughly as rank^−zipf (the Gumbel-max argument; the lead measures
// the real histogram on the CPU reference).
#ifndef TANDEM_COMMON_MODEL_GEN_ROUTING_SKEW_H_
#define TANDEM_COMMON_MODEL_GEN_ROUTING_SKEW_H_

#include <cstdint>
#include <vector>

#include "common/model_gen/model_spec.h"

namespace tandem {

// μ: the size of the common embedding component, per element (embedding elements are N(0, 1)).
inline constexpr float kSkewEmbeddingOffset = 0.5f;
// Assumed growth of the residual stream's mean square per layer (two blocks, each adding about
// (0.5 · output gain)² = 0.0625); used to keep the skew from fading with depth.
inline constexpr float kSkewResidualGrowthPerLayer = 0.125f;

// The sign pattern s (h entries of ±1), from the seed.
std::vector<float> SkewDirection(const GenModelSpec& spec);

// Per expert e of `layer`, the coefficient c_e such that the router row gets c_e·s_j/√h added
// to element j. Zero for every expert when spec.zipf == 0.
std::vector<float> RouterSkewCoefficients(const GenModelSpec& spec, int64_t layer);

// The logit shift the coefficients aim at: −zipf·(ln rank_e − mean_e ln rank_e).
std::vector<double> TargetLogitShifts(const GenModelSpec& spec, int64_t layer);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GEN_ROUTING_SKEW_H_
