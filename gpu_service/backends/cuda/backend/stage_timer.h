// Per-stage GPU time of one backend step, from CUDA events (behind an option: with profiling off
// every call is a no-op and no event is recorded).
//
// The step marks the start of each stage on its stream; the time from one mark to the next is
// charged to the earlier mark's stage, so the stages partition the step's GPU timeline (host waits
// between kernels, such as the router's picks coming back, fall into the stage that was running).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_STAGE_TIMER_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_STAGE_TIMER_H_

#include <cuda_runtime.h>

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_service/backends/cuda/device_buffer.h"

namespace tandem::cuda {

enum class Stage { kIo, kEngram, kStreams, kGdn, kAttention, kRoute, kExperts, kShared, kHead, kCount };
inline constexpr int kStageCount = static_cast<int>(Stage::kCount);
const char* StageName(Stage s);

class StageTimer {
 public:
  // enabled = false: Mark and Finish do nothing. max_marks bounds the marks of one step. The
  // events are made either way, so that timing can be switched on later (set_enabled).
  static absl::StatusOr<StageTimer> Create(bool enabled, int max_marks);

  bool enabled() const { return enabled_; }
  // Takes effect at the next Begin (not in the middle of a step).
  void set_enabled(bool on) { pending_enabled_ = on; }
  // Starts a step (forgets the previous step's marks).
  void Begin() {
    used_ = 0;
    enabled_ = pending_enabled_;
  }
  // The GPU reaches stage s now on `stream`. Marks past max_marks are folded into the last one.
  void Mark(Stage s, cudaStream_t stream);
  // Ends the step: records the last event, waits for it, and sums the intervals per stage.
  absl::Status Finish(cudaStream_t stream);
  // Milliseconds per stage of the last finished step, and their sum.
  const std::array<double, kStageCount>& stage_ms() const { return ms_; }
  double total_ms() const;
  // "tokens=T seqs=B total=X.XXX ms io=... engram=... ..." for the last finished step.
  std::string Line(int64_t tokens, int64_t sequences) const;

 private:
  bool enabled_ = false;
  bool pending_enabled_ = false;
  std::vector<Event> events_;
  std::vector<Stage> stages_;
  int used_ = 0;
  std::array<double, kStageCount> ms_{};
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_STAGE_TIMER_H_
