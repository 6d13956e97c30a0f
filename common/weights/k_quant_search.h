// The scale searches of ggml's reference K-quant quantizers (ggml-quants.c: nearest_int,
// make_qx_quants, make_q3_quants, make_qkx2_quants), re-implemented with the same f32 arithmetic
// in the same order so that Tandem's quantized bytes equal ggml's. Internal to tandem_weights.
#ifndef TANDEM_COMMON_WEIGHTS_K_QUANT_SEARCH_H_
#define TANDEM_COMMON_WEIGHTS_K_QUANT_SEARCH_H_

#include <cstdint>

namespace tandem::kquant {

// Groups whose largest magnitude is below this are treated as all zero (ggml's GROUP_MAX_EPS).
inline constexpr float kGroupMaxEps = 1e-15f;

// Rounds to the nearest integer, ties to even, for |value| <= 4194303 (ggml's nearest_int: adding
// 1.5 * 2^23 leaves the rounded integer in the low mantissa bits).
int NearestInt(float value);

// Symmetric search with weights x^2 (make_qx_quants with rmse_type 1, no importance weights):
// levels[i] in [0, 2 * nmax) stand for level - nmax; returns the scale (negative when the group's
// largest-magnitude value is positive), 0 for an all-zero group (levels then all 0).
float MakeSymmetricQuants(int n, int nmax, const float* x, int8_t* levels);

// make_q3_quants with do_rmse: a symmetric start refined by up to five rounds of per-element
// coordinate descent on the x^2-weighted error. levels[i] in [0, 2 * nmax) stand for level - nmax.
float MakeQ3Quants(int n, int nmax, const float* x, int8_t* levels);

// make_qkx2_quants: asymmetric levels in [0, nmax] with x ~ scale * level - *min_out, searching
// nstep + 1 trial inverse scales (rmin + rdelta * is + nmax) / (max - min) for the least weighted
// error (absolute error when use_mad, squared otherwise). *min_out >= 0. scratch holds n bytes.
float MakeAsymmetricQuants(int n, int nmax, const float* x, const float* weights, uint8_t* levels, float* min_out,
                           uint8_t* scratch, float rmin, float rdelta, int nstep, bool use_mad);

}  // namespace tandem::kquant

#endif  // TANDEM_COMMON_WEIGHTS_K_QUANT_SEARCH_H_
