// Round-trip latency of the offload channel, for `tandem bench worker`. Not a test: it reports
// numbers, it does not judge them.
#ifndef TANDEM_GPU_SERVICE_OFFLOAD_CHANNEL_BENCH_H_
#define TANDEM_GPU_SERVICE_OFFLOAD_CHANNEL_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/offload/channel_layout.h"
#include "common/offload/doorbell.h"
#include "gpu_service/offload/offload_client.h"

namespace tandem {

struct ChannelBenchOptions {
  // The worker to spawn (its flags must make it serve a model of this shape and fingerprint).
  std::string worker_path;
  std::vector<std::string> worker_args;
  uint64_t model_fingerprint = 0;
  uint32_t layer_count = 1;
  uint32_t expert_count = 16;
  uint32_t hidden_size = 2048;
  uint32_t decode_pairs = 10;       // the decode-shaped request: one token, K experts
  int round_trips = 20000;          // per spinning case (after 1000 warm-up calls)
  int wake_ups = 200;               // sleeping-worker case
  // The client's own spin/sleep while it waits for replies.
  DoorbellWaitOptions client_wait = OffloadClientOptions().wait;
};

struct LatencySummary {
  int samples = 0;
  double p50_us = 0;
  double p99_us = 0;
  double max_us = 0;
  double mean_worker_compute_us = 0;  // the worker's own time inside the round trip
};

struct ChannelBenchResult {
  LatencySummary empty_spinning;    // 0 pairs, worker spinning
  LatencySummary decode_spinning;   // decode_pairs pairs, 1 activation row, worker spinning
  LatencySummary wake_from_sleep;   // empty request sent while the worker sleeps on the futex
};

// Spawns the worker, measures, and stops it.
absl::StatusOr<ChannelBenchResult> RunChannelBench(const ChannelBenchOptions& options);

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_OFFLOAD_CHANNEL_BENCH_H_
