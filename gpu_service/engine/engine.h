// The engine: the step loop. One thread asks the scheduler for the next batch, runs it on the
// backend, samples each request's next token, applies its stop conditions and streams updates to
// its sink (vLLM's "engine core" role; the scheduler decides, the backend computes).
//
//   Engine engine(backend, options, metrics);
//   absl::StatusOr<uint64_t> id = engine.Submit(spec, sink);   // from any thread
//   engine.Cancel(*id);                                         // client went away
//
// Submit, Cancel, StopAdmitting, WaitUntilIdle and the counters are thread-safe. The backend is
// used only from the engine's thread. The destructor cancels whatever still runs (each sink gets
// its CANCELLED update) and joins the thread.
#ifndef TANDEM_GPU_SERVICE_ENGINE_ENGINE_H_
#define TANDEM_GPU_SERVICE_ENGINE_ENGINE_H_

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "gpu_service/backend/backend.h"
#include "gpu_service/engine/generation_request.h"
#include "gpu_service/metrics/service_metrics.h"
#include "gpu_service/scheduler/scheduler.h"

namespace tandem {

struct EngineOptions {
  SchedulerOptions scheduler;
  // Context limit: prompt + generated tokens of one sequence. The model's own limit applies too.
  int64_t max_context = 0;  // 0: the model's context length
};

class Engine {
 public:
  // `backend` (and `metrics`, which may be null) must outlive the engine. Starts the thread.
  Engine(Backend* backend, const EngineOptions& options, ServiceMetrics* metrics);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request (the spec is assumed validated: non-empty prompt of valid ids, shorter than
  // max_context()). Returns its id. ResourceExhausted when the queue is full; Unavailable after
  // StopAdmitting. On error the sink is not called.
  absl::StatusOr<uint64_t> Submit(GenerationSpec spec, std::shared_ptr<GenerationSink> sink);
  // Ends the request at the next step with CANCELLED and frees its state. Unknown or finished
  // ids are ignored.
  void Cancel(uint64_t id);

  // New Submits fail with Unavailable from now on; queued and running requests continue.
  void StopAdmitting();
  // Waits until no request is queued or running, or until `deadline`; true when idle.
  bool WaitUntilIdle(SteadyTime deadline);
  // Cancels every queued and running request.
  void CancelAll();

  int64_t max_context() const { return max_context_; }
  int64_t running() const;
  int64_t waiting() const;

 private:
  struct Request;
  void Loop();
  // Runs one planned step (outside the lock).
  void RunStep(StepPlan& plan);
  // Sends the final update and forgets the request (releasing its slot).
  void Finish(Request* r, GenerationUpdate update, FinishReason reason, std::string detail,
              absl::StatusCode error_code = absl::StatusCode::kInternal);
  // Samples a token for a request whose chunk sampled; returns the update to send.
  void Advance(Request* r, std::span<const float> logits);

  Backend* backend_;
  ServiceMetrics* metrics_;
  int64_t max_context_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the loop waits for work
  std::condition_variable idle_cv_;  // WaitUntilIdle waits for idleness
  Scheduler scheduler_;              // guarded by mu_
  absl::flat_hash_map<uint64_t, std::unique_ptr<Request>> requests_;  // guarded by mu_
  uint64_t next_id_ = 1;
  bool admitting_ = true;
  bool stopping_ = false;
  // Engine thread only: one vocab row per sampling chunk, from the backend (AllocateLogits), grown
  // when a step samples more chunks than it holds.
  Backend::LogitsBuffer logits_;
  size_t logits_floats_ = 0;
  // Engine thread only: the last four steps' wall times (step i's at recent_steps_[i % 4]). Their
  // maximum is the expected time of the next step: a request whose deadline falls before the next
  // step would end is ended now, with its output so far, rather than answered after its deadline
  // (when gRPC has already cancelled the call).
  std::array<SteadyTime::duration, 4> recent_steps_{};
  size_t steps_run_ = 0;
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_ENGINE_ENGINE_H_
