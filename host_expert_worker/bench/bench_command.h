// `tandem bench worker [--model F] [--json] [--threads N] [--gb G] [--isa I] [--worker PATH]
// [--no-channel]`: the host expert worker's throughput next to the machine's DRAM read bandwidth
// measured in the same run, and the offload channel's round trip with a real tandem-host-worker.
//
// (a) Expert weight bytes processed per second for decode-shaped requests (10 experts x 1 row,
//     10 x 8, 64 x 4) at Qwen3-Next-80B-A3B expert shapes (h = 2048, I = 512, Q4_K), on synthetic
//     random valid blocks in memory (a --gb working set, default 2 GB, rotating through layers so
//     every request reads weights that are not in any cache); with --model, that file's experts.
//     Also one expert x one row on a single thread with the same expert every request (weights
//     warm in the core's caches): the per-core compute rate of the 1-row path, free of DRAM.
// (b) The DRAM read bandwidth of the same threads over a buffer as large as the working set.
// (c) Channel round trips (empty request p50/p99, decode-shaped, wake-up) through
//     gpu_service/offload/channel_bench.h with a spawned tandem-host-worker serving a generated
//     model with 80B expert shapes (or --model).
// Not a test: it reports numbers, it does not judge them.
#ifndef TANDEM_HOST_EXPERT_WORKER_BENCH_BENCH_COMMAND_H_
#define TANDEM_HOST_EXPERT_WORKER_BENCH_BENCH_COMMAND_H_

namespace tandem {

// argv[0] = "bench", argv[1] = "worker". Returns 0, 1 on a failure (printed to stderr), 2 on bad
// usage.
int RunBenchCommand(int argc, char** argv);

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_BENCH_BENCH_COMMAND_H_
