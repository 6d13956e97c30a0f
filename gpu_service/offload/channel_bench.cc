#include "gpu_service/offload/channel_bench.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gpu_service/offload/offload_client.h"

namespace tandem {
namespace {

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

LatencySummary Summarize(std::vector<int64_t> nanos, int64_t compute_ns_total) {
  LatencySummary s;
  s.samples = static_cast<int>(nanos.size());
  if (nanos.empty()) return s;
  std::sort(nanos.begin(), nanos.end());
  auto at = [&](double q) {
    return nanos[std::min(nanos.size() - 1, static_cast<size_t>(q * nanos.size()))] / 1e3;
  };
  s.p50_us = at(0.50);
  s.p99_us = at(0.99);
  s.max_us = nanos.back() / 1e3;
  s.mean_worker_compute_us = compute_ns_total / 1e3 / nanos.size();
  return s;
}

absl::StatusOr<LatencySummary> MeasureSpinning(OffloadClient& client, const OffloadRequest& request,
                                               std::vector<float>& outputs, int round_trips) {
  std::vector<int64_t> nanos;
  nanos.reserve(round_trips);
  int64_t compute_total = 0;
  for (int i = -1000; i < round_trips; ++i) {
    const int64_t start = NowNanos();
    absl::StatusOr<OffloadReply> reply =
        client.Call(request, outputs, absl::Now() + absl::Seconds(5));
    const int64_t elapsed = NowNanos() - start;
    if (!reply.ok()) return reply.status();
    if (i >= 0) {
      nanos.push_back(elapsed);
      compute_total += reply->worker_compute_ns;
    }
  }
  return Summarize(std::move(nanos), compute_total);
}

}  // namespace

absl::StatusOr<ChannelBenchResult> RunChannelBench(const ChannelBenchOptions& options) {
  OffloadClientOptions client_options;
  client_options.capacities = {std::max(options.decode_pairs, 1u), 1, options.hidden_size,
                               std::max(options.decode_pairs, 1u), options.layer_count,
                               options.expert_count};
  client_options.model_fingerprint = options.model_fingerprint;
  client_options.worker_path = options.worker_path;
  client_options.worker_args = options.worker_args;
  client_options.wait = options.client_wait;
  absl::StatusOr<std::unique_ptr<OffloadClient>> client = OffloadClient::Create(client_options);
  if (!client.ok()) return client.status();
  if (absl::Status s = (*client)->WaitUntilReady(absl::Now() + absl::Seconds(30)); !s.ok()) {
    return s;
  }

  ChannelBenchResult result;
  std::vector<float> activation(options.hidden_size, 0.5f);
  std::vector<float> no_outputs;
  OffloadRequest empty{0, {}, activation, false};
  absl::StatusOr<LatencySummary> summary =
      MeasureSpinning(**client, empty, no_outputs, options.round_trips);
  if (!summary.ok()) return summary.status();
  result.empty_spinning = *summary;

  std::vector<ExpertRowPair> pairs;
  for (uint32_t i = 0; i < options.decode_pairs; ++i) {
    pairs.push_back({i % options.expert_count, 0});
  }
  std::vector<float> outputs(size_t{options.decode_pairs} * options.hidden_size);
  OffloadRequest decode{0, pairs, activation, false};
  summary = MeasureSpinning(**client, decode, outputs, options.round_trips);
  if (!summary.ok()) return summary.status();
  result.decode_spinning = *summary;

  // Wake-up: wait until the worker has given up spinning and sleeps, then time one call.
  std::vector<int64_t> nanos;
  int64_t compute_total = 0;
  for (int i = 0; i < options.wake_ups; ++i) {
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (!(*client)->WorkerSleeping()) {
      if (absl::Now() > give_up) {
        return absl::DeadlineExceededError("the worker never went to sleep");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const int64_t start = NowNanos();
    absl::StatusOr<OffloadReply> reply =
        (*client)->Call(empty, no_outputs, absl::Now() + absl::Seconds(5));
    const int64_t elapsed = NowNanos() - start;
    if (!reply.ok()) return reply.status();
    nanos.push_back(elapsed);
    compute_total += reply->worker_compute_ns;
  }
  result.wake_from_sleep = Summarize(std::move(nanos), compute_total);
  return result;
}

}  // namespace tandem
