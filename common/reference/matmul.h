// y = W·x for a batch of activation rows, with W in any supported block format.
//
// x holds n rows of w.cols f32 values (row-major, row t at x + t * w.cols); y receives n rows of
// w.rows values (y[t * w.rows + r] = ⟨W row r, x row t⟩). Each weight row is dequantized once
// (into per-thread scratch; f32 rows are read in place) and then dotted with all n inputs, so a
// prefill batch costs one pass over the weights. Dot products accumulate in f64. Work is split over
// output rows on `pool` (nullptr: the calling thread). y must not alias x.
#ifndef TANDEM_COMMON_REFERENCE_MATMUL_H_
#define TANDEM_COMMON_REFERENCE_MATMUL_H_

#include <cstdint>

#include "common/reference/thread_pool.h"
#include "common/reference/weight_view.h"

namespace tandem {

void MatMul(const MatrixView& w, const float* x, int64_t n, float* y, ThreadPool* pool);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_MATMUL_H_
