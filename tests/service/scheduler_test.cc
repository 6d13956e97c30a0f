// The scheduler's policy, without a backend: admission order, the token budget, the bounded
// queue, cancellation and deadlines.
#include "gpu_service/scheduler/scheduler.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

std::unique_ptr<ScheduledSequence> Seq(uint64_t id, int64_t prompt) {
  auto s = std::make_unique<ScheduledSequence>();
  s->id = id;
  s->known_tokens = prompt;
  return s;
}

// What the engine does after a step: feed the chunks, sample where the chunk reached the end.
void Apply(const StepPlan& plan) {
  for (const StepPlan::Chunk& c : plan.chunks) {
    c.seq->computed_tokens += c.count;
    if (c.samples) ++c.seq->known_tokens;
  }
}

const SteadyTime kNow = std::chrono::steady_clock::now();

TEST(SchedulerTest, AdmitsInArrivalOrderUpToMaxRunning) {
  Scheduler s({/*max_running=*/2, /*max_queue=*/8, /*step_token_budget=*/100});
  auto a = Seq(1, 3), b = Seq(2, 3), c = Seq(3, 3);
  ASSERT_TRUE(s.Enqueue(a.get()).ok());
  ASSERT_TRUE(s.Enqueue(b.get()).ok());
  ASSERT_TRUE(s.Enqueue(c.get()).ok());
  StepPlan p = s.Schedule(kNow);
  ASSERT_EQ(p.admitted.size(), 2u);
  EXPECT_EQ(p.admitted[0], a.get());
  EXPECT_EQ(p.admitted[1], b.get());
  EXPECT_EQ(s.running(), 2);
  EXPECT_EQ(s.waiting(), 1);
  Apply(p);
  s.Finish(a.get());
  p = s.Schedule(kNow);
  ASSERT_EQ(p.admitted.size(), 1u);
  EXPECT_EQ(p.admitted[0], c.get());
  // b decodes (one token) before c's prefill.
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].seq, b.get());
  EXPECT_EQ(p.chunks[0].count, 1);
  EXPECT_EQ(p.chunks[1].seq, c.get());
  EXPECT_EQ(p.chunks[1].count, 3);
}

TEST(SchedulerTest, ChunksPrefillUnderTheBudgetAndMixesWithDecode) {
  Scheduler s({/*max_running=*/4, /*max_queue=*/8, /*step_token_budget=*/8});
  auto a = Seq(1, 6), b = Seq(2, 6);
  ASSERT_TRUE(s.Enqueue(a.get()).ok());
  ASSERT_TRUE(s.Enqueue(b.get()).ok());
  StepPlan p = s.Schedule(kNow);
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].count, 6);
  EXPECT_TRUE(p.chunks[0].samples);
  EXPECT_EQ(p.chunks[1].count, 2);  // what the budget leaves
  EXPECT_FALSE(p.chunks[1].samples);
  Apply(p);
  p = s.Schedule(kNow);
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].seq, a.get());  // decode first
  EXPECT_EQ(p.chunks[0].count, 1);
  EXPECT_EQ(p.chunks[1].seq, b.get());
  EXPECT_EQ(p.chunks[1].start, 2);
  EXPECT_EQ(p.chunks[1].count, 4);
  EXPECT_TRUE(p.chunks[1].samples);
  int64_t total = 0;
  for (const auto& c : p.chunks) total += c.count;
  EXPECT_LE(total, 8);
}

TEST(SchedulerTest, DoesNotAdmitWhenTheBudgetIsSpent) {
  Scheduler s({/*max_running=*/4, /*max_queue=*/8, /*step_token_budget=*/4});
  auto a = Seq(1, 10), b = Seq(2, 2);
  ASSERT_TRUE(s.Enqueue(a.get()).ok());
  ASSERT_TRUE(s.Enqueue(b.get()).ok());
  StepPlan p = s.Schedule(kNow);
  ASSERT_EQ(p.admitted.size(), 1u);  // a took the whole budget; b waits its turn
  EXPECT_EQ(s.waiting(), 1);
}

TEST(SchedulerTest, PreemptedSequenceWaitsAtTheHeadUntilARunningOneFinishes) {
  Scheduler s({/*max_running=*/3, /*max_queue=*/8, /*step_token_budget=*/100});
  auto a = Seq(1, 3), b = Seq(2, 3), c = Seq(3, 3);
  for (auto* q : {a.get(), b.get()}) ASSERT_TRUE(s.Enqueue(q).ok());
  Apply(s.Schedule(kNow));  // a and b run, one token sampled each
  s.Preempt(b.get());
  EXPECT_EQ(b->computed_tokens, 0);
  EXPECT_EQ(b->known_tokens, 4);  // its sampled token stays: it is fed again
  ASSERT_TRUE(s.Enqueue(c.get()).ok());
  // Room for two more, but admission waits for a running sequence to finish.
  StepPlan p = s.Schedule(kNow);
  EXPECT_TRUE(p.admitted.empty());
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].seq, a.get());
  Apply(p);
  s.Finish(a.get());
  // Then the preempted one first (queue head), from its first token, then c.
  p = s.Schedule(kNow);
  ASSERT_EQ(p.admitted.size(), 2u);
  EXPECT_EQ(p.admitted[0], b.get());
  EXPECT_EQ(p.admitted[1], c.get());
  EXPECT_EQ(p.chunks[0].start, 0);
  EXPECT_EQ(p.chunks[0].count, 4);
  EXPECT_TRUE(p.chunks[0].samples);
}

TEST(SchedulerTest, FullQueueIsResourceExhausted) {
  Scheduler s({/*max_running=*/1, /*max_queue=*/1, /*step_token_budget=*/4});
  auto a = Seq(1, 2), b = Seq(2, 2), c = Seq(3, 2);
  ASSERT_TRUE(s.Enqueue(a.get()).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(s.Enqueue(b.get())));
  s.Schedule(kNow);  // a runs; the queue has room again
  ASSERT_TRUE(s.Enqueue(b.get()).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(s.Enqueue(c.get())));
}

TEST(SchedulerTest, CancelledSequencesLeaveAtTheNextSchedule) {
  Scheduler s({/*max_running=*/1, /*max_queue=*/4, /*step_token_budget=*/16});
  auto a = Seq(1, 2), b = Seq(2, 2);
  ASSERT_TRUE(s.Enqueue(a.get()).ok());
  ASSERT_TRUE(s.Enqueue(b.get()).ok());
  Apply(s.Schedule(kNow));
  a->cancelled = true;
  b->cancelled = true;
  StepPlan p = s.Schedule(kNow);
  ASSERT_EQ(p.cancelled.size(), 2u);
  EXPECT_EQ(p.cancelled[0], a.get());
  EXPECT_TRUE(p.cancelled_was_running[0]);
  EXPECT_EQ(p.cancelled[1], b.get());
  EXPECT_FALSE(p.cancelled_was_running[1]);
  EXPECT_TRUE(p.chunks.empty());
  EXPECT_TRUE(s.idle());
}

TEST(SchedulerTest, ExpiredSequencesLeaveWithTheirState) {
  Scheduler s({/*max_running=*/1, /*max_queue=*/4, /*step_token_budget=*/16});
  auto a = Seq(1, 2), b = Seq(2, 2);
  a->deadline = kNow + std::chrono::seconds(10);
  b->deadline = kNow + std::chrono::seconds(5);
  ASSERT_TRUE(s.Enqueue(a.get()).ok());
  ASSERT_TRUE(s.Enqueue(b.get()).ok());
  Apply(s.Schedule(kNow));
  StepPlan p = s.Schedule(kNow + std::chrono::seconds(6));
  ASSERT_EQ(p.expired.size(), 1u);
  EXPECT_EQ(p.expired[0], b.get());
  EXPECT_FALSE(p.expired_was_running[0]);
  EXPECT_EQ(p.chunks.size(), 1u);  // a decodes on
  p = s.Schedule(kNow + std::chrono::seconds(10));
  ASSERT_EQ(p.expired.size(), 1u);
  EXPECT_EQ(p.expired[0], a.get());
  EXPECT_TRUE(p.expired_was_running[0]);
  EXPECT_TRUE(s.idle());
}

TEST(SchedulerTest, OptionsAreChecked) {
  EXPECT_TRUE(CheckSchedulerOptions({1, 0, 1}).ok());
  EXPECT_FALSE(CheckSchedulerOptions({0, 0, 1}).ok());
  EXPECT_FALSE(CheckSchedulerOptions({1, -1, 1}).ok());
  EXPECT_FALSE(CheckSchedulerOptions({1, 0, 0}).ok());
}

}  // namespace
}  // namespace tandem
