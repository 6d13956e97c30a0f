// The GPU service's end of the offload channel to one host expert worker.
//
// The client creates the segment (mode 0600, random name, removed when the client is destroyed)
// and either spawns the worker itself (worker_path set: the worker is started with worker_args
// plus "--channel=<name>", and restarted after it dies) or waits for a worker started by hand
// with that name (worker_path empty). One request is in flight at a time.
//
// Failure contract: a worker that dies mid-request is detected by waitpid (spawned worker), by
// kill(pid, 0) or by its heartbeat stopping (connected worker), and the pending Wait returns
// Unavailable within sleep_slice (spawned) or heartbeat_timeout + sleep_slice (connected), well
// under a second.
// A worker that stays alive but does not answer by the Wait's deadline is given up the same way
// (a spawned one is killed). The next Send or WaitUntilReady then respawns the worker (spawned)
// or adopts the next worker that attaches (connected).
//
// Not thread-safe: one thread drives a client (MultiWorkerClient drives several from one thread).
#ifndef TANDEM_GPU_SERVICE_OFFLOAD_OFFLOAD_CLIENT_H_
#define TANDEM_GPU_SERVICE_OFFLOAD_OFFLOAD_CLIENT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/offload/channel_layout.h"
#include "common/offload/doorbell.h"
#include "common/offload/shared_segment.h"
#include "gpu_service/offload/worker_process.h"

namespace tandem {

struct OffloadClientOptions {
  ChannelCapacities capacities;
  uint64_t model_fingerprint = 0;  // ModelFingerprint() of the expert tensors the service loaded
  // Spawned worker: the executable and its flags (NUMA node, expert range, ...); the client
  // appends "--channel=<name>". Empty: connect to a worker started by hand.
  std::string worker_path;
  std::vector<std::string> worker_args;
  // Waiting for a reply: spin (the reply of a decode-sized request usually comes within it), then
  // sleep; the worker-liveness check runs every check_interval while spinning.
  DoorbellWaitOptions wait = {absl::Milliseconds(1), absl::Milliseconds(2),
                              absl::Microseconds(50)};
  // A connected worker whose heartbeat does not move for this long is declared dead (spawned
  // workers are watched with waitpid instead). Long enough for a loaded machine not to starve a
  // live worker's heartbeat thread past it, short enough to fail well under a second.
  absl::Duration heartbeat_timeout = absl::Milliseconds(400);
  // Shutdown: how long a spawned worker gets to exit after the stop flag before SIGKILL.
  absl::Duration terminate_grace = absl::Milliseconds(500);
};

struct OffloadRequest {
  uint32_t layer = 0;
  std::span<const ExpertRowPair> pairs;  // row indices refer to rows of `activations`
  std::span<const float> activations;    // activation_row_count * hidden_size floats
  bool exact = false;                    // f32 activations in the worker's dot products
};

struct OffloadReply {
  uint32_t pair_count = 0;
  int64_t worker_compute_ns = 0;
  // MultiWorkerClient::Call only: activation bytes written into the workers' requests (each worker
  // gets only the rows its pairs use, so a row used by two workers counts twice).
  uint64_t activation_bytes = 0;
  // Wait(): one row of hidden_size floats per pair, in pair order; a view into the segment, valid
  // until the next Send. Call(): empty (the rows were copied to the caller's buffer).
  std::span<const float> outputs;
};

class OffloadClient {
 public:
  // Creates the segment and, in spawn mode, starts the worker (without waiting for it).
  static absl::StatusOr<std::unique_ptr<OffloadClient>> Create(const OffloadClientOptions& options);

  // Sets the stop flag, gives a spawned worker terminate_grace to exit, then kills it; removes the
  // segment.
  ~OffloadClient();
  OffloadClient(const OffloadClient&) = delete;
  OffloadClient& operator=(const OffloadClient&) = delete;

  // The name to give a worker started by hand (--channel=<name>).
  const std::string& channel_name() const { return segment_->name(); }
  const ChannelCapacities& capacities() const { return view_.capacities(); }

  // Blocks until a worker serves the channel or `deadline`. Spawn mode: (re)starts the worker if
  // none runs. FailedPrecondition when the worker refused the segment (the message is the
  // worker's reason, e.g. a fingerprint mismatch); Unavailable when a spawned worker exited
  // during start-up; DeadlineExceeded otherwise.
  absl::Status WaitUntilReady(absl::Time deadline);
  bool connected() const { return connected_; }
  pid_t worker_pid() const { return worker_pid_; }

  // Copies the request into the segment and rings the doorbell; does not wait. Without a ready
  // worker it tries once to (re)connect without blocking and returns Unavailable if none is
  // ready yet. InvalidArgument for requests over the channel's capacities.
  absl::Status Send(const OffloadRequest& request);

  // Waits for the reply to the last Send. InvalidArgument / Internal when the worker rejected the
  // request (the message names the field); Unavailable when the worker died, or when the deadline
  // passed: a worker that does not answer in time is given up as stuck (a spawned one is killed
  // and restarted by the next WaitUntilReady; the channel is reset for a new worker).
  absl::StatusOr<OffloadReply> Wait(absl::Time deadline);

  // Send + Wait, copying the rows to `outputs` (pairs.size() * hidden_size floats).
  absl::StatusOr<OffloadReply> Call(const OffloadRequest& request, std::span<float> outputs,
                                    absl::Time deadline);

  // True while the worker sleeps on the request doorbell (for the wake-up benchmark and tests).
  bool WorkerSleeping() const;

 private:
  OffloadClient(const OffloadClientOptions& options, std::unique_ptr<SharedSegment> segment,
                ChannelView view);
  absl::Status SpawnWorker();            // spawn mode: start a worker on a reset channel
  absl::Status TryConnect();             // non-blocking step of WaitUntilReady
  void ResetChannelForNewWorker();       // epoch++, state kEmpty
  void Disconnect();                     // forget the worker; reset for the next one
  bool WorkerDead(std::string* why);     // liveness check while waiting

  OffloadClientOptions options_;
  std::unique_ptr<SharedSegment> segment_;
  ChannelView view_;
  std::unique_ptr<WorkerProcess> process_;  // spawn mode only
  bool connected_ = false;
  pid_t worker_pid_ = 0;
  uint64_t next_sequence_ = 0;
  uint64_t in_flight_sequence_ = 0;  // 0: none
  uint64_t last_heartbeat_ = 0;
  absl::Time last_heartbeat_change_;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_OFFLOAD_OFFLOAD_CLIENT_H_
