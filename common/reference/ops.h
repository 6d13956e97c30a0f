// Elementwise and per-row helpers shared by the reference blocks (docs/MODEL.md section 4 notation).
// All take and return f32; reductions accumulate in f64 so that the reference stays the most
// accurate implementation of the contract.
#ifndef TANDEM_COMMON_REFERENCE_OPS_H_
#define TANDEM_COMMON_REFERENCE_OPS_H_

#include <cmath>
#include <cstdint>

namespace tandem {

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float Silu(float x) { return x * Sigmoid(x); }
// log(1 + e^x), computed without overflow (x itself above 20, as torch does).
inline float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// y = gamma ⊙ x / sqrt(mean(x²) + eps) over n values (ρ of MODEL.md times gamma); gamma may be
// nullptr (no scale). y may alias x.
void RmsNorm(const float* x, int64_t n, float eps, const float* gamma, float* y);

// x ← x / sqrt(Σx² + eps) (the L2 normalisation of GDN queries and keys).
void L2Normalize(float* x, int64_t n, float eps);

// In-place softmax over n values (max-subtracted).
void Softmax(float* x, int64_t n);

// f32 dot product with f64 accumulation.
float Dot(const float* a, const float* b, int64_t n);

// NeoX rotary embedding at position pos: for i < rot/2, dims i and i + rot/2 rotate by the angle
// pos · theta^(−2i/rot) (computed in f64); dims >= rot are left alone. rot is even and <= dim.
void RopeNeox(float* x, int64_t rot, double theta, int64_t pos);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_OPS_H_
