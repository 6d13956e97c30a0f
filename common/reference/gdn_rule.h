// The gated delta rule of one value head (docs/MODEL.md §4.4 step 5), in its two equivalent forms.
//
// Inputs for n tokens, row-major: q (n × dk, already L2-normalised and scaled by 1/√dk), k (n × dk,
// L2-normalised), v (n × dv), g (n log decays, ≤ 0), beta (n, in (0, 1)). state is S (dk × dv,
// row i = key dimension i), read as the state before the first token and overwritten with the
// state after the last. o receives n × dv outputs. Both forms compute, per token and in this order,
// S ← S·exp(g); δ = β(v − Sᵀk); S ← S + k·δᵀ; o = Sᵀq.
#ifndef TANDEM_COMMON_REFERENCE_GDN_RULE_H_
#define TANDEM_COMMON_REFERENCE_GDN_RULE_H_

#include <cstdint>

namespace tandem {

// Token by token (decode, and the definition).
void GatedDeltaRuleRecurrent(const float* q, const float* k, const float* v, const float* g,
                             const float* beta, int64_t n, int64_t dk, int64_t dv, float* state,
                             float* o);

// The chunked form used for prefill (flash-linear-attention's chunk_gated_delta_rule): tokens are
// taken in chunks of `chunk` (the last may be shorter). Within a chunk, with G_t the cumulative
// log decay and A[t][i] = β_t·exp(G_t − G_i)·⟨k_t, k_i⟩ for i < t, the UT transform
// T = (I + A)⁻¹ gives the WY representation U = T·(β⊙V), W = T·(β·exp(G)⊙K); the corrected values
// are Δ = U − W·S₀, the outputs o_t = exp(G_t)·S₀ᵀq_t + Σ_{i≤t} exp(G_t − G_i)⟨q_t, k_i⟩Δ_i and the
// state leaving the chunk exp(G_last)·S₀ + Σ_i exp(G_last − G_i)·k_i·Δ_iᵀ. Equal to the recurrent
// form to rounding.
void GatedDeltaRuleChunked(const float* q, const float* k, const float* v, const float* g,
                           const float* beta, int64_t n, int64_t dk, int64_t dv, int64_t chunk,
                           float* state, float* o);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_GDN_RULE_H_
