// The worker's end of the offload channel: attaches to a segment the GPU service created and
// answers its requests with an ExpertRowComputer.
//
// Every request is validated (version, fingerprint, flags, layer, counts, output range, every
// pair) before any memory it points at is touched; a bad request gets an error reply naming the
// field, and the server keeps serving.
#ifndef TANDEM_HOST_EXPERT_WORKER_CHANNEL_CHANNEL_SERVER_H_
#define TANDEM_HOST_EXPERT_WORKER_CHANNEL_CHANNEL_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/offload/channel_layout.h"
#include "common/offload/doorbell.h"
#include "common/offload/shared_segment.h"
#include "host_expert_worker/channel/expert_row_computer.h"

namespace tandem {

struct ChannelServerOptions {
  // Waiting for the next request: spin this long after each reply (the service's next MoE layer
  // usually follows within it), then sleep on the doorbell futex.
  DoorbellWaitOptions wait = {absl::Milliseconds(2), absl::Milliseconds(5),
                              absl::Microseconds(200)};
  // How often the heartbeat counter is bumped (by its own thread, so long computations do not
  // stall it). Connected clients declare the worker dead after several missed beats.
  absl::Duration heartbeat_interval = absl::Milliseconds(5);
};

class ChannelServer {
 public:
  // Opens segment `channel_name`, checks magic, version and capacities, and claims it (one worker
  // per segment). Then checks the segment's fingerprint, layer count, expert count and hidden size
  // against computer->shape(): on a mismatch it marks the segment refused (with the reason in
  // the header, for the client to report) and returns FailedPrecondition. `computer` must
  // outlive the server.
  static absl::StatusOr<std::unique_ptr<ChannelServer>> Attach(
      const std::string& channel_name, ExpertRowComputer* computer,
      const ChannelServerOptions& options = {});

  ~ChannelServer();
  ChannelServer(const ChannelServer&) = delete;
  ChannelServer& operator=(const ChannelServer&) = delete;

  // Marks the worker ready and serves requests until Stop(), the client's stop flag (both: OK),
  // the client process disappearing (Unavailable), or the client handing the channel to another
  // worker (Aborted). Call once.
  absl::Status Serve();

  // Makes Serve return soon (within one request). Thread-safe.
  void Stop();

  // Requests answered so far (good and bad).
  uint64_t requests_served() const { return served_.load(std::memory_order_relaxed); }

 private:
  enum class StopReason { kNone, kStopped, kClientGone, kReplaced };

  ChannelServer(std::unique_ptr<SharedSegment> segment, ChannelView view,
                ExpertRowComputer* computer, const ChannelServerOptions& options, uint64_t epoch);
  StopReason CheckStop() const;
  void Answer(uint64_t sequence);

  std::unique_ptr<SharedSegment> segment_;
  ChannelView view_;
  ExpertRowComputer* computer_;
  ChannelServerOptions options_;
  uint64_t epoch_;
  std::vector<ExpertRowPair> pairs_;  // snapshot of the request's pairs (max_pairs)
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> served_{0};
};

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_CHANNEL_CHANNEL_SERVER_H_
