// The streaming matvec's launch arithmetic (matvec_stream.cuh's host side), in plain C++ so that
// host tests can check it without a GPU: the block size, resident blocks per SM by the occupancy
// rules, and the choice of split (warps per row) and grid.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STREAM_PLAN_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STREAM_PLAN_H_

#include <cstddef>
#include <cstdint>

namespace tandem::cuda::fastmv {

// Threads of every fastmv block (matvec_core.cuh's kernels).
inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;

// Resident blocks per SM of a kernel with `regs` registers per thread and `smem` bytes of
// dynamic shared memory (the occupancy rules of sm_90: registers per warp in units of 256,
// 1 KB of shared memory reserved per block).
inline int ResidentBlocks(int regs, size_t smem, int smem_per_sm) {
  const int warp_regs = (regs * 32 + 255) / 256 * 256;
  const int by_regs = warp_regs > 0 ? 65536 / (warp_regs * kWarps) : 8;
  const int by_smem = static_cast<int>(static_cast<size_t>(smem_per_sm) / (smem + 1024));
  const int by_threads = 2048 / kThreads;
  int b = by_regs < by_smem ? by_regs : by_smem;
  b = b < by_threads ? b : by_threads;
  return b > 0 ? b : 1;
}

// The split (warps per row) and the grid (blocks) of a launch. Model: a lane keeps `depth`
// pieces in flight, so a row group of ppl = ceil(pieces / (lpr·wpr)) pieces per lane costs about
// ceil(ppl / depth) memory latencies, plus one more per group (staging, reduction and the ramp of
// the next group); the busiest block walks ceil(groups / blocks) groups. Among wpr = 1, 2, 4, 8
// that leave every warp a piece per lane the cheapest wins, the larger split (more blocks) on
// ties. The per-group latency was fitted to the H200 sweep of forced splits (tests/gpu/NOTES.md,
// 2026-11-29): it orders the measured splits of every Q8_0 and Q4_K decode shape but one.
// `capacity` is the resident blocks of one wave; forced_wpr > 0 and forced_blocks > 0
// (benchmarks, tests) override. `sms` > 0 (Q8_0x8 at one activation row, whose lanes hold kS = 4
// rows × a 3-deep ring of 16-byte pieces, passed as depth 4) breaks ties towards the larger split
// only while its grid stays within one block per SM: the H200 sweep of 2026-12-01 (tests/gpu/
// NOTES.md) has 2048→4096 fastest at wpr 1 (128 blocks: 4.46 us, wpr 2: 5.02) and 4096→2048 at
// wpr 2 (128 blocks: 4.67 us, wpr 4: 5.16), against one latency per 3 pieces and larger splits on
// ties, which picked the slower of each pair; past one block per SM the second block's cross-warp
// reduction costs more than the latency it saves.
struct StreamSplit {
  int wpr = 1;
  int blocks = 1;
};
inline StreamSplit ChooseStreamSplit(int pieces, int lpr, int depth, int rows_per_block_at_wpr1, int out_rows,
                                     int capacity, int forced_wpr, int forced_blocks, int sms = 0) {
  StreamSplit best;
  int64_t best_cost = -1;
  for (int wpr = 1; wpr <= kWarps; wpr *= 2) {
    if (forced_wpr > 0 && wpr != forced_wpr) continue;
    if (forced_wpr <= 0 && wpr > 1 && pieces < lpr * wpr) break;
    const int rpb = rows_per_block_at_wpr1 / wpr;
    const int64_t groups = (out_rows + rpb - 1) / rpb;
    const int64_t cap = forced_blocks > 0 ? forced_blocks : capacity;
    const int64_t blocks = groups < cap ? groups : cap;
    const int64_t per_block = (groups + blocks - 1) / blocks;
    const int64_t per_lane = (pieces + lpr * wpr - 1) / (lpr * wpr);
    const int64_t cost = per_block * ((per_lane + depth - 1) / depth + 1);
    if (best_cost < 0 || cost < best_cost || (cost == best_cost && (sms <= 0 || blocks <= sms))) {
      best_cost = cost;
      best.wpr = wpr;
      best.blocks = static_cast<int>(blocks);
    }
  }
  return best;
}

// Tuning overrides for a streaming launch (0 = chosen by ChooseStreamSplit).
struct StreamTuning {
  int warps_per_row = 0;
  int blocks_per_sm = 0;  // grid.x = SMs · blocks_per_sm (capped by the row groups)
};

}  // namespace tandem::cuda::fastmv

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STREAM_PLAN_H_
