#include "host_expert_worker/kernels/exact_row_dot.h"

#include <cstring>

namespace tandem {
namespace {

// 16 independent partial sums so the loop vectorizes and rounding stays small for long rows.
float DotF32(const float* a, const float* b, int64_t n) {
  float partial[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) partial[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) partial[0] += a[i] * b[i];
  float sum = 0.0f;
  for (float p : partial) sum += p;
  return sum;
}

}  // namespace

void ExactRowDots(WeightType type, const uint8_t* weights, int64_t row_bytes, int64_t row_count,
                  int64_t cols, const float* const* x, int x_count, float* const* out,
                  float* scratch) {
  for (int64_t r = 0; r < row_count; ++r) {
    const uint8_t* row = weights + r * row_bytes;
    const float* w;
    if (type == WeightType::kF32) {
      // GGUF tensor data is 32-byte aligned and f32 rows are whole floats, so this is aligned.
      w = reinterpret_cast<const float*>(row);
    } else {
      DequantizeRow(type, row, scratch, cols);
      w = scratch;
    }
    for (int k = 0; k < x_count; ++k) out[k][r] = DotF32(w, x[k], cols);
  }
}

}  // namespace tandem
