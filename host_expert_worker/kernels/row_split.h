// How one phase of an ExpertFfnEngine pass is shared by the thread team.
//
// A phase's work is `tiles` tiles of `dim` weight rows each, laid end to end in one row space
// (row g is row g % dim of tile g / dim). Each thread first streams one contiguous static range
// of that space, so that it reads long runs of consecutive weight rows (whole experts' matrices
// at decode) and claims nothing; the ranges are sized by each tile's estimated cost per row, so
// that the threads finish them together. The last eighth of the cost is a tail that threads
// claim in chunks once their own range is done: it absorbs the cost estimate's error and a thread
// that the OS descheduled. At one activation row per expert the earlier scheme (every unit
// claimed, about four per thread, each tile's last unit short) left the slowest thread a unit
// behind the rest, about a fifth of a phase (docs/PERF.md).
#ifndef TANDEM_HOST_EXPERT_WORKER_KERNELS_ROW_SPLIT_H_
#define TANDEM_HOST_EXPERT_WORKER_KERNELS_ROW_SPLIT_H_

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace tandem {

inline constexpr int64_t kRowSplitStep = 16;  // range boundaries fall on multiples of this

struct RowSplit {
  int64_t dim = 0;          // rows per tile (a multiple of kRowSplitStep)
  int64_t total = 0;        // tiles * dim
  int64_t tail_begin = 0;   // the first row of the claimed tail (= bounds[threads])
  int64_t tail_chunk = 0;   // rows per claim in the tail
  const int64_t* bounds = nullptr;  // thread t's static range is [bounds[t], bounds[t + 1])
};

// Splits tiles * dim rows among `threads`, where tile i costs tile_cost[i] (> 0) per row. Writes
// threads + 1 entries to bounds, which the returned split points to.
RowSplit MakeRowSplit(const int64_t* tile_cost, int64_t tiles, int64_t dim, int threads, int64_t* bounds);

// Calls fn(tile, first_row, rows) for thread t's static range and then for tail chunks claimed
// through `next` (zero before the phase), cutting every range at tile boundaries.
template <typename Fn>
void ForEachRowRange(const RowSplit& s, int t, std::atomic<int64_t>& next, Fn&& fn) {
  auto run = [&](int64_t g, int64_t end) {
    while (g < end) {
      const int64_t tile = g / s.dim;
      const int64_t rows = std::min(end, (tile + 1) * s.dim) - g;
      fn(tile, g - tile * s.dim, rows);
      g += rows;
    }
  };
  run(s.bounds[t], s.bounds[t + 1]);
  for (;;) {
    const int64_t g = s.tail_begin + next.fetch_add(1, std::memory_order_relaxed) * s.tail_chunk;
    if (g >= s.total) return;
    run(g, std::min(s.total, g + s.tail_chunk));
  }
}

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_KERNELS_ROW_SPLIT_H_
