// The exact path: weight rows dequantized to f32 (DequantizeRow, bit-exact with ggml) and dotted
// with f32 activations by f32 multiply-adds. Used for the exact mode (end-to-end validation against
// the CPU reference) and for float weight types (F32 / F16 / BF16) in every mode.
#ifndef TANDEM_HOST_EXPERT_WORKER_KERNELS_EXACT_ROW_DOT_H_
#define TANDEM_HOST_EXPERT_WORKER_KERNELS_EXACT_ROW_DOT_H_

#include <cstdint>

#include "common/weights/weight_types.h"

namespace tandem {

// out[k][r] = <weight row r, x[k]> for r < row_count, k < x_count (any count). Each weight row is
// dequantized once into `scratch` (cols floats; unused for F32 weights) and dotted with every x.
void ExactRowDots(WeightType type, const uint8_t* weights, int64_t row_bytes, int64_t row_count,
                  int64_t cols, const float* const* x, int x_count, float* const* out,
                  float* scratch);

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_KERNELS_EXACT_ROW_DOT_H_
