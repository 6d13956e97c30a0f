// Activation rows quantized to int8 for integer dot products with quantized weights, as ggml does:
// K-quant weights meet Q8_K activations (one f32 scale per 256, int8 values, int16 sums per 16),
// Q8_0 / Q4_0 weights meet 32-element blocks (one scale per 32). Tandem keeps the per-32 scale in
// f32 (ggml stores f16); that only removes a rounding step.
//
// Quantization: d = max|x| / 127 over the block, q = round-to-nearest-even(x / d) (all zero when
// the block is zero). The same code runs for every kernel ISA, so quantized activations are
// bit-identical whichever dot-product path consumes them.
#ifndef TANDEM_HOST_EXPERT_WORKER_KERNELS_ACTIVATION_BLOCKS_H_
#define TANDEM_HOST_EXPERT_WORKER_KERNELS_ACTIVATION_BLOCKS_H_

#include <cstdint>

#include "common/weights/weight_types.h"

namespace tandem {

struct alignas(64) ActivationBlockQ8K {
  float d;
  int8_t pad[60];      // keeps qs on a cache-line boundary for aligned vector loads
  int8_t qs[256];
  int16_t bsums[16];   // bsums[i] = sum of qs[16 i .. 16 i + 15]
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

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_KERNELS_ACTIVATION_BLOCKS_H_
