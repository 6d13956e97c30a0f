// HostExpertWorkers: the CPU backend's RemoteExperts (expert_placement.h) over real host worker
// processes (tandem-host-worker), through gpu_service/offload's MultiWorkerClient.
//
// Mapping: one Run(layer, work, x, h, out) becomes one channel request per worker holding, for
// the pairs of that worker's experts, only the activation rows of the tokens they use (renumbered
// densely) and the (expert, row) pairs; the replies' rows are put back in work order. Work larger
// than the channel's capacities is sent in several requests.
//
// Failure policy (error, no fallback): when a worker dies, Run returns Unavailable for the step
// that was waiting on it (within the offload client's detection time, well under a second), and
// every later Run returns Unavailable at once until all workers serve again. The CPU backend fails
// the step, the engine ends the step's requests with UNAVAILABLE, and the service reports
// NOT_SERVING (available() is false; the listener is told). A background thread restarts a
// spawned worker (or waits for a hand-started one to attach to the same channel again) and then
// reports available, without restarting the service. Every loss is counted (losses()), so that a
// loss noticed by the recovery thread's idle probe between two calls of a running step, and
// repaired before the step's next call, still ends the sequences that were running then.
// Computing the lost rows in the service instead would need every expert's weights in the
// service, which is what the budget is for.
//
// Threading: Run is called from the backend's step thread; available(), worker_status() and the
// listener may be used from any thread.
#ifndef TANDEM_GPU_SERVICE_BACKEND_REMOTE_EXPERTS_H_
#define TANDEM_GPU_SERVICE_BACKEND_REMOTE_EXPERTS_H_

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/gguf/gguf_file.h"
#include "common/model/model_config.h"
#include "common/offload/model_fingerprint.h"
#include "gpu_service/backend/expert_placement.h"
#include "gpu_service/backend/remote_experts_spec.h"
#include "gpu_service/offload/multi_worker_client.h"

namespace tandem {

struct HostExpertWorkersOptions {
  std::vector<RemoteWorkerSpec> workers;  // OrderWorkerShares'd: share K is workers[K]
  std::string worker_binary;              // for spawned specs
  std::string model_path;                 // given to spawned workers
  bool exact = false;                     // workers in their exact mode (f32 activations)
  // A step waits this long for a worker's reply; a worker that misses it is given up as stuck
  // (the step fails with Unavailable, the worker is restarted like a dead one).
  absl::Duration call_timeout = absl::Seconds(30);
  // Activation rows per channel request (pairs: rows × experts per token).
  uint32_t max_rows_per_request = 256;
  // More arguments for spawned workers (tests: --test_stall_after_requests).
  std::vector<std::string> extra_worker_args;
  // Events for the service's log: ("worker_ready", fields) when a worker (re)attaches,
  // ("worker_lost", fields) when one is lost. Fields are JSON members without braces.
  std::function<void(const std::string& event, const std::string& fields)> log;
};

class HostExpertWorkers : public RemoteExperts {
 public:
  // Creates every worker's channel and starts the spawned workers (without waiting for them).
  // `layer_count` is the number of layers with routed experts (ModelWeights::layers.size()).
  static absl::StatusOr<std::unique_ptr<HostExpertWorkers>> Start(
      const GgufFile& file, const ModelConfig& config, uint32_t layer_count,
      HostExpertWorkersOptions options);

  // Stops the recovery thread, then the workers (the offload clients' destructors).
  ~HostExpertWorkers() override;

  // Blocks until every worker serves, or `deadline` (DeadlineExceeded naming the missing share);
  // FailedPrecondition when a worker refused the channel (e.g. another model's file). On success
  // the workers are available and the recovery thread runs from then on.
  absl::Status WaitUntilReady(absl::Time deadline);

  absl::Status Run(int64_t layer, std::span<const ExpertWork> work, const float* x, int64_t h,
                   float* out) override;
  std::optional<uint64_t> activation_bytes_sent() const override {
    return activation_bytes_.load(std::memory_order_relaxed);
  }
  uint64_t losses() const override { return losses_.load(std::memory_order_acquire); }

  // True while every worker serves.
  bool available() const { return available_.load(std::memory_order_acquire); }
  // Called with the new value on every change of available() (from the step thread or the
  // recovery thread); must be cheap.
  void SetAvailabilityListener(std::function<void(bool)> listener);

  struct WorkerStatus {
    std::string share;    // "K/N"
    std::string channel;  // the segment name (what a hand-started worker is given)
    bool spawned = false;
    pid_t pid = 0;        // 0 while none serves
  };
  std::vector<WorkerStatus> worker_status() const;

 private:
  HostExpertWorkers(HostExpertWorkersOptions options, uint32_t hidden, uint32_t experts_per_token,
                    std::unique_ptr<MultiWorkerClient> client);
  void MarkLost(const absl::Status& why);                       // mu_ held
  void LogReadyWorkers();                                       // mu_ held
  void RecoveryLoop();

  HostExpertWorkersOptions options_;
  uint32_t hidden_;
  uint32_t experts_per_token_;

  mutable std::mutex mu_;  // guards client_ and the scratch below
  std::unique_ptr<MultiWorkerClient> client_;
  std::vector<ExpertRowPair> pairs_;    // one chunk's pairs
  std::vector<float> rows_;             // one chunk's activation rows
  std::vector<size_t> chunk_index_;     // chunk pair i is work[chunk_index_[i]]
  std::vector<int64_t> row_of_token_;   // token -> row in the chunk (-1: none)
  std::vector<pid_t> known_pids_;

  std::atomic<uint64_t> activation_bytes_{0};
  std::atomic<bool> available_{false};
  std::atomic<uint64_t> losses_{0};  // MarkLost's transitions to unavailable
  std::mutex listener_mu_;
  std::function<void(bool)> listener_;

  std::mutex recovery_mu_;
  std::condition_variable recovery_cv_;
  bool stopping_ = false;
  std::thread recovery_;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_BACKEND_REMOTE_EXPERTS_H_
