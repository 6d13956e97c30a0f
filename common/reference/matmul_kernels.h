// Internal to tandem_reference: the per-instruction-set halves of MatMul (matmul.h).
//
// matmul.cc picks one of the MatMulRows* functions below and splits the output rows over
// threads; each computes y rows [row_begin, row_end) for all n activation rows. Every variant
// produces the same bits: the summation order is fixed by the numerics contract in matmul.h, and
// the vector kernels only map it onto wider registers (matmul_rows.h says how).
#ifndef TANDEM_COMMON_REFERENCE_MATMUL_KERNELS_H_
#define TANDEM_COMMON_REFERENCE_MATMUL_KERNELS_H_

#include <cstdint>

#include "common/reference/weight_view.h"

namespace tandem::matmul_internal {

// A dot product is summed in f32 over chunks of this many elements (a K-quant super-block, eight
// Q4_0 / Q8_0 blocks, or 256 plain floats) and the chunk sums in f64.
inline constexpr int64_t kChunkElems = 256;
// Element i of a chunk is accumulated in f32 lane i % kLanes.
inline constexpr int64_t kLanes = 64;
// Weight rows whose chunks are dequantized together, so that one activation chunk is read from
// L1 for all of them; and activation rows handled per dequantization of a weight chunk.
inline constexpr int64_t kRowTile = 4;
inline constexpr int64_t kTokenTile = 16;

struct MatMulJob {
  MatrixView w;
  const float* x;  // n rows of w.cols
  int64_t n;
  float* y;  // n rows of w.rows
};

void MatMulRowsScalar(const MatMulJob& job, int64_t row_begin, int64_t row_end);
// Need AVX2 + FMA + F16C.
void MatMulRowsAvx2(const MatMulJob& job, int64_t row_begin, int64_t row_end);
// Needs AVX-512 F/BW/VL/DQ.
void MatMulRowsAvx512(const MatMulJob& job, int64_t row_begin, int64_t row_end);

}  // namespace tandem::matmul_internal

#endif  // TANDEM_COMMON_REFERENCE_MATMUL_KERNELS_H_
