// Activation rows quantized to int8 for integer dot products with quantized weights.
// K-quant weights meet ActivationBlockQ8K (256 int8 values per block, like ggml's Q8_K) but with
// one f32 scale per 32 values instead of one per 256: every K-quant sub-block is 16 or 32 values,
// so each sub-block's exact integer sum just takes its group's scale, and the finer scale cuts
// the activation rounding error by about a quarter on Gaussian rows (more on heavy-tailed ones).
// Q8_0 / Q4_0 weights meet 32-element blocks (one scale per 32). Tandem keeps every scale in f32
// (ggml stores f16); that only removes a rounding step.
//
// Quantization: d = max|x| / 127 over the 32 values, q = round-to-nearest-even(x / d) (all zero
// when they are all zero). The same code runs for every kernel ISA, so quantized activations are
// bit-identical whichever dot-product path consumes them.
//
// Two-term rows: x ~ hi + lo, hi = Q(x) and lo = Q(x - hi), each an ordinary quantized row. A dot
// product with both (the kernels' `terms` = 2) costs one weight pass and twice the integer work,
// and leaves about 1/127 of one row's rounding error. The engine uses it for the input of down
// (SiLU(g)·u, whose heavy tails make a single int8 row the largest error term; docs/PERF.md).
// In the Q8K format lo's scales are exactly hi's / 256 (lo = round(256 (x - hi) / d_hi), so it
// keeps about 8 more bits), which lets a kernel fold hi and lo into one exact integer sum
// 256 * dot(q, hi) + dot(q, lo) per group; kernels must check it (a pair of independently
// quantized rows is still a valid two-term input). Q8x32 lo rows keep their own scales.
#ifndef TANDEM_HOST_EXPERT_WORKER_KERNELS_ACTIVATION_BLOCKS_H_
#define TANDEM_HOST_EXPERT_WORKER_KERNELS_ACTIVATION_BLOCKS_H_

#include <cstdint>

#include "common/weights/weight_types.h"

namespace tandem {

struct alignas(64) ActivationBlockQ8K {
  int8_t qs[256];
  float lane_d[4][16];  // lane_d[j][L] = d[2 j + L / 8]: the scale of each int32 lane of the
                        // AVX-512 kernels' partial sums over elements 64 j .. 64 j + 63
  float bsum_d[16];     // bsum_d[s] = d[s / 2] * (sum of qs[16 s .. 16 s + 15]), for the mins term
  float d[8];           // d[g]: the scale of qs[32 g .. 32 g + 31]
};

struct ActivationBlockQ8x32 {
  float d;
  int8_t qs[32];
};

enum class ActivationFormat {
  kF32,    // plain floats: float weight types, and every type in the exact mode
  kQ8K,    // ActivationBlockQ8K per 256
  kQ8x32,  // ActivationBlockQ8x32 per 32
};

// The integer format a weight type's dot products use (kF32 for F32 / F16 / BF16).
ActivationFormat IntegerActivationFormat(WeightType type);

// Bytes of one quantized row of n elements (n a multiple of the format's block).
int64_t ActivationRowBytes(ActivationFormat format, int64_t n);

// Quantizes n floats (n a multiple of 256, resp. 32) into n / 256 (n / 32) blocks.
void QuantizeActivationsQ8K(const float* x, int64_t n, ActivationBlockQ8K* out);
void QuantizeActivationsQ8x32(const float* x, int64_t n, ActivationBlockQ8x32* out);

// The value block element e stands for (d * q).
inline float ActivationValue(const ActivationBlockQ8K& block, int e) { return block.d[e / 32] * block.qs[e]; }
inline float ActivationValue(const ActivationBlockQ8x32& block, int e) { return block.d * block.qs[e]; }

// Two-term quantization of n floats: hi = Q(x), lo = Q(x - hi) (Q8K: at hi's scales / 256).
// `residual` is n floats of scratch.
void QuantizeActivationsTwoTerm(ActivationFormat format, const float* x, int64_t n, float* residual,
                                void* hi, void* lo);

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_KERNELS_ACTIVATION_BLOCKS_H_
