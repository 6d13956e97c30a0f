// The DRAM read bandwidth of the worker's threads: every thread of the team streams its slice of a
// buffer far larger than the caches with wide loads (the same access pattern the expert kernels
// have, without the arithmetic). Not a test: it measures, it does not judge.
#ifndef TANDEM_HOST_EXPERT_WORKER_BENCH_DRAM_BANDWIDTH_H_
#define TANDEM_HOST_EXPERT_WORKER_BENCH_DRAM_BANDWIDTH_H_

#include <cstdint>

#include "host_expert_worker/kernels/worker_thread_pool.h"

namespace tandem {

// Reads `bytes` (a multiple of 4096) from `data` on every thread of `pool` (equal slices), `passes`
// times; returns the best pass's bytes per second.
double MeasureReadBandwidth(const uint8_t* data, uint64_t bytes, int passes, WorkerThreadPool* pool);

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_BENCH_DRAM_BANDWIDTH_H_
