// MatMul's portable variant: DequantizeRow's values, the contract's 64 lanes as an array, one
// std::fma per element. It is the executable statement of the numerics in matmul.h that the
// vector variants are tested against.
#include <cmath>
#include <cstdint>

#include "common/reference/matmul_kernels.h"
#include "common/reference/matmul_rows.h"

namespace tandem::matmul_internal {
namespace {

struct ScalarOps {
  static constexpr bool kReferenceDequant = true;

  static float DotPartial(const float* w, const float* x, int64_t m) {
    float lane[kLanes] = {};
    for (int64_t i = 0; i < m; ++i) lane[i % kLanes] = std::fma(w[i], x[i], lane[i % kLanes]);
    float s16[16], s8[8], s4[4], s2[2];
    for (int k = 0; k < 16; ++k) s16[k] = (lane[k] + lane[k + 16]) + (lane[k + 32] + lane[k + 48]);
    for (int k = 0; k < 8; ++k) s8[k] = s16[k] + s16[k + 8];
    for (int k = 0; k < 4; ++k) s4[k] = s8[k] + s8[k + 4];
    for (int k = 0; k < 2; ++k) s2[k] = s4[k] + s4[k + 2];
    return s2[0] + s2[1];
  }

  static float DotChunk(const float* w, const float* x) { return DotPartial(w, x, kChunkElems); }
};

}  // namespace

void MatMulRowsScalar(const MatMulJob& job, int64_t row_begin, int64_t row_end) {
  MatMulRows<ScalarOps>(job, row_begin, row_end);
}

}  // namespace tandem::matmul_internal
