// The scheduler: continuous batching as a pure policy (no backend, no threads, no clock of its
// own). It decides which sequences run in the next step and how many tokens each feeds; the
// engine turns that into a backend step, samples, and tells the scheduler what happened.
//
// Policy:
//  - FIFO admission: a waiting sequence joins the running set between steps when fewer than
//    max_running run and the step's token budget is not spent; the queue's head is never skipped.
//  - Each step feeds at most step_token_budget tokens in total. Decoding sequences (one pending
//    token each) go first, in admission order; then prefill continues, chunked, in admission order
//    (the newly admitted last). A prefill chunk that does not reach the sequence's last known token
//    does not sample.
//  - The queue is bounded: Enqueue answers ResourceExhausted when max_queue sequences wait.
//  - A cancelled sequence, or one whose deadline has passed, is removed at the next Schedule
//    (waiting or running) and reported, so the engine frees its state and answers it.
//  - Preemption: when the backend has no room for a step (its KV cache is full), the engine
//    preempts a running sequence: it goes back to the queue's head with nothing computed (its
//    known tokens are fed again when it is re-admitted), and admission pauses until a running
//    sequence finishes, so that the freed room is not taken again at once.
//
// Not thread-safe; the engine serialises calls. ScheduledSequence::cancelled may be set from any
// thread.
#ifndef TANDEM_GPU_SERVICE_SCHEDULER_SCHEDULER_H_
#define TANDEM_GPU_SERVICE_SCHEDULER_SCHEDULER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

using SteadyTime = std::chrono::steady_clock::time_point;

struct SchedulerOptions {
  int64_t max_running = 32;         // sequences in the running set at once (>= 1)
  int64_t max_queue = 256;          // waiting sequences (>= 0); beyond: ResourceExhausted
  int64_t step_token_budget = 256;  // tokens fed per step, prefill and decode together (>= 1)
};

// Checks the ranges above; InvalidArgument naming the flag.
absl::Status CheckSchedulerOptions(const SchedulerOptions& options);

// What the scheduler knows of one request. Owned by the engine; it must stay alive until it has
// been removed (Finish, or reported in a plan's cancelled / expired lists).
struct ScheduledSequence {
  uint64_t id = 0;
  // Tokens the model must have consumed before the next sample: the prompt plus every generated
  // token. The engine raises it by one per sampled token.
  int64_t known_tokens = 0;
  // Tokens already fed to the backend (the engine raises it by each chunk's count).
  int64_t computed_tokens = 0;
  SteadyTime deadline = SteadyTime::max();
  std::atomic<bool> cancelled{false};

  int64_t pending_tokens() const { return known_tokens - computed_tokens; }
};

struct StepPlan {
  struct Chunk {
    ScheduledSequence* seq = nullptr;
    int64_t start = 0;     // == seq->computed_tokens
    int64_t count = 0;     // tokens fed this step (>= 1)
    bool samples = false;  // start + count == known_tokens: the step's logits pick a token
  };
  std::vector<Chunk> chunks;                  // the batch, in order
  std::vector<ScheduledSequence*> admitted;   // joined the running set this step
  std::vector<ScheduledSequence*> cancelled;  // removed: cancelled (were waiting or running)
  std::vector<ScheduledSequence*> expired;    // removed: deadline passed
  // For each removed sequence, whether it was running (holds backend state).
  std::vector<bool> cancelled_was_running, expired_was_running;

  bool empty() const { return chunks.empty() && cancelled.empty() && expired.empty(); }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options) : options_(options) {}

  // Appends to the queue. ResourceExhausted when max_queue sequences are waiting.
  absl::Status Enqueue(ScheduledSequence* seq);

  // Removes cancelled sequences and those whose deadline is at or before `expire_by`, admits from
  // the queue, and plans the next step's chunks. The engine passes the time the coming step is
  // expected to end, so that no request is answered after its deadline.
  StepPlan Schedule(SteadyTime expire_by);

  // Removes a running or waiting sequence (finished, or failed). Unknown ones are ignored.
  void Finish(ScheduledSequence* seq);

  // Moves a running sequence back to the head of the queue with computed_tokens = 0, and pauses
  // admission until a running sequence finishes (or none runs). Unknown ones are ignored.
  void Preempt(ScheduledSequence* seq);

  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  bool idle() const { return running_.empty() && waiting_.empty(); }
  const SchedulerOptions& options() const { return options_; }

 private:
  SchedulerOptions options_;
  std::vector<ScheduledSequence*> running_;  // admission order
  std::deque<ScheduledSequence*> waiting_;   // arrival order
  bool admission_paused_ = false;            // after a preemption, until a running one finishes
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_SCHEDULER_SCHEDULER_H_
