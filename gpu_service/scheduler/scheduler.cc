#include "gpu_service/scheduler/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status CheckSchedulerOptions(const SchedulerOptions& o) {
  if (o.max_running < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-running: ", o.max_running, " < 1"));
  }
  if (o.max_queue < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max-queue: ", o.max_queue, " < 0"));
  }
  if (o.step_token_budget < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--step-token-budget: ", o.step_token_budget, " < 1"));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Enqueue(ScheduledSequence* seq) {
  if (static_cast<int64_t>(waiting_.size()) >= options_.max_queue) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the request queue is full (", options_.max_queue, " waiting)"));
  }
  waiting_.push_back(seq);
  return absl::OkStatus();
}

void Scheduler::Finish(ScheduledSequence* seq) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  if (it != running_.end()) {
    running_.erase(it);
    admission_paused_ = false;  // its room is free now
    return;
  }
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
}

void Scheduler::Preempt(ScheduledSequence* seq) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  if (it == running_.end()) return;
  running_.erase(it);
  seq->computed_tokens = 0;
  waiting_.push_front(seq);
  admission_paused_ = true;
}

StepPlan Scheduler::Schedule(SteadyTime expire_by) {
  StepPlan plan;
  // 1. Drop cancelled and expiring sequences, running first (they hold state).
  auto sweep = [&](auto& list, bool running) {
    for (auto it = list.begin(); it != list.end();) {
      ScheduledSequence* s = *it;
      if (s->cancelled.load(std::memory_order_acquire)) {
        plan.cancelled.push_back(s);
        plan.cancelled_was_running.push_back(running);
        it = list.erase(it);
        if (running) admission_paused_ = false;  // its room is free now
      } else if (expire_by >= s->deadline) {
        plan.expired.push_back(s);
        plan.expired_was_running.push_back(running);
        it = list.erase(it);
        if (running) admission_paused_ = false;
      } else {
        ++it;
      }
    }
  };
  sweep(running_, true);
  sweep(waiting_, false);

  int64_t budget = options_.step_token_budget;
  auto add_chunk = [&](ScheduledSequence* s, int64_t limit) {
    const int64_t count = std::min(s->pending_tokens(), limit);
    if (count <= 0) return;
    plan.chunks.push_back(StepPlan::Chunk{s, s->computed_tokens, count,
                                          s->computed_tokens + count == s->known_tokens});
    budget -= count;
  };
  // 2. Decodes (one pending token) first, then prefill continuations.
  for (ScheduledSequence* s : running_) {
    if (budget == 0) break;
    if (s->pending_tokens() == 1) add_chunk(s, 1);
  }
  for (ScheduledSequence* s : running_) {
    if (budget == 0) break;
    if (s->pending_tokens() > 1) add_chunk(s, budget);
  }
  // 3. FIFO admission while there is room and budget; each admitted sequence starts prefill now.
  // Paused after a preemption until a running sequence finishes (or none runs).
  if (running_.empty()) admission_paused_ = false;
  while (!admission_paused_ && !waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < options_.max_running) {
    ScheduledSequence* s = waiting_.front();
    waiting_.pop_front();
    running_.push_back(s);
    plan.admitted.push_back(s);
    add_chunk(s, budget);
  }
  return plan;
}

}  // namespace tandem
