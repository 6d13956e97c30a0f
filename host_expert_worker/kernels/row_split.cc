#include "host_expert_worker/kernels/row_split.h"

namespace tandem {

RowSplit MakeRowSplit(const int64_t* tile_cost, int64_t tiles, int64_t dim, int threads, int64_t* bounds) {
  RowSplit s;
  s.dim = dim;
  s.total = tiles * dim;
  s.bounds = bounds;
  int64_t cost = 0;
  for (int64_t i = 0; i < tiles; ++i) cost += tile_cost[i] * dim;
  const int64_t static_cost = threads > 1 ? cost - cost / 8 : cost;
  // One sweep over the tiles: bounds[t] is where the running cost reaches t / threads of the
  // static cost, rounded to a step inside its tile.
  int64_t tile = 0, before = 0;  // cost of the tiles before `tile`
  for (int t = 0; t <= threads; ++t) {
    const int64_t target = static_cost * t / threads;
    while (tile < tiles && before + tile_cost[tile] * dim < target) before += tile_cost[tile++] * dim;
    if (tile == tiles) {
      bounds[t] = s.total;
      continue;
    }
    int64_t rows = (target - before) / tile_cost[tile];
    rows = std::min(dim, (rows + kRowSplitStep / 2) / kRowSplitStep * kRowSplitStep);
    bounds[t] = tile * dim + rows;
  }
  bounds[0] = 0;
  s.tail_begin = bounds[threads];
  const int64_t tail = s.total - s.tail_begin;
  s.tail_chunk = std::max(kRowSplitStep, (tail / (2 * threads) + kRowSplitStep - 1) / kRowSplitStep * kRowSplitStep);
  return s;
}

}  // namespace tandem
