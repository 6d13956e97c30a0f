#include "gpu_service/backends/cuda/backend/stage_timer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gpu_service/backends/cuda/cuda_check.h"

namespace tandem::cuda {

const char* StageName(Stage s) {
  static const char* const kNames[kStageCount] = {"io",     "engram", "streams", "gdn", "attention",
                                                  "route",  "experts", "shared", "head"};
  const int i = static_cast<int>(s);
  return i >= 0 && i < kStageCount ? kNames[i] : "?";
}

absl::StatusOr<StageTimer> StageTimer::Create(bool enabled, int max_marks) {
  StageTimer t;
  t.enabled_ = t.pending_enabled_ = enabled;
  // One more event than marks: the end of the step.
  for (int i = 0; i < max_marks + 1; ++i) {
    absl::StatusOr<Event> e = Event::Create(/*timing=*/true);
    if (!e.ok()) return e.status();
    t.events_.push_back(*std::move(e));
  }
  t.stages_.resize(static_cast<size_t>(max_marks));
  return t;
}

void StageTimer::Mark(Stage s, cudaStream_t stream) {
  if (!enabled_) return;
  if (used_ > 0 && stages_[used_ - 1] == s) return;  // still the same stage
  if (used_ == static_cast<int>(stages_.size())) return;  // out of marks: the last stage runs on
  cudaEventRecord(events_[used_].get(), stream);
  stages_[used_++] = s;
}

absl::Status StageTimer::Finish(cudaStream_t stream) {
  ms_.fill(0.0);
  if (!enabled_ || used_ == 0) return absl::OkStatus();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[used_].get(), stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events_[used_].get()));
  for (int i = 0; i < used_; ++i) {
    float ms = 0;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events_[i].get(), events_[i + 1].get()));
    ms_[static_cast<int>(stages_[i])] += ms;
  }
  return absl::OkStatus();
}

double StageTimer::total_ms() const {
  double t = 0;
  for (double v : ms_) t += v;
  return t;
}

std::string StageTimer::Line(int64_t tokens, int64_t sequences) const {
  std::string line = absl::StrFormat("tokens=%d seqs=%d total=%.3f ms", tokens, sequences, total_ms());
  for (int i = 0; i < kStageCount; ++i) {
    absl::StrAppend(&line, absl::StrFormat(" %s=%.3f", StageName(static_cast<Stage>(i)), ms_[i]));
  }
  return line;
}

}  // namespace tandem::cuda
