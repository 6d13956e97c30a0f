#include "common/reference/matmul.h"

#include <algorithm>
#include <vector>

namespace tandem {
namespace {

// Weight rows dequantized together, so that each activation row is read once per tile from cache.
constexpr int64_t kRowTile = 8;

// Four independent f64 partial sums keep the loop pipelined without reassociating a single chain.
double DotF64(const float* a, const float* b, int64_t n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += static_cast<double>(a[i]) * b[i];
    s1 += static_cast<double>(a[i + 1]) * b[i + 1];
    s2 += static_cast<double>(a[i + 2]) * b[i + 2];
    s3 += static_cast<double>(a[i + 3]) * b[i + 3];
  }
  for (; i < n; ++i) s0 += static_cast<double>(a[i]) * b[i];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace

void MatMul(const MatrixView& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  const int64_t cols = w.cols;
  const int64_t rows = w.rows;
  if (n <= 0 || rows <= 0) return;
  // Tiles of rows are the unit of work; small matrices stay on one thread.
  const int64_t tiles = (rows + kRowTile - 1) / kRowTile;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols * kRowTile * n));
  ParallelFor(pool, 0, tiles, grain, [&](int64_t tile_begin, int64_t tile_end) {
    thread_local std::vector<float> scratch;
    const bool in_place = w.type == WeightType::kF32;
    if (!in_place) scratch.resize(static_cast<size_t>(kRowTile * cols));
    const float* tile_rows[kRowTile];
    for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
      const int64_t r0 = tile * kRowTile;
      const int64_t count = std::min(kRowTile, rows - r0);
      for (int64_t j = 0; j < count; ++j) {
        if (in_place) {
          tile_rows[j] = reinterpret_cast<const float*>(w.row(r0 + j));
        } else {
          float* dst = scratch.data() + j * cols;
          DequantizeRow(w.type, w.row(r0 + j), dst, cols);
          tile_rows[j] = dst;
        }
      }
      for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * cols;
        float* yt = y + t * rows + r0;
        for (int64_t j = 0; j < count; ++j) yt[j] = static_cast<float>(DotF64(tile_rows[j], xt, cols));
      }
    }
  });
}

}  // namespace tandem
