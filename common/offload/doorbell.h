// Doorbells: a 64-bit sequence word in shared memory that one side publishes and the other waits
// on, spinning briefly and then sleeping.
//
// Why a futex on the sequence word rather than a semaphore or condition variable in the segment:
//  - The wake condition is the sequence word itself, so there is no second piece of state (a
//    semaphore count) that drifts from it when the waiter consumed a request while spinning.
//  - The publisher makes a syscall only when the waiter has announced that it sleeps (the
//    `waiters` word), so the spinning fast path has no syscall on either side.
//  - A futex has no owner: a peer killed at any instant leaves nothing locked (a process-shared
//    mutex held by a SIGKILLed worker would hang the client).
//  - Timed sleeps wake the waiter every sleep_slice to check that the peer is still alive.
// Lost wake-ups are impossible: the waiter stores waiters=1 then re-reads the sequence, the
// publisher stores the sequence then reads waiters (both sequentially consistent), and the kernel
// re-checks the word's low 32 bits atomically before sleeping.
#ifndef TANDEM_COMMON_OFFLOAD_DOORBELL_H_
#define TANDEM_COMMON_OFFLOAD_DOORBELL_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"

namespace tandem {

struct DoorbellWaitOptions {
  // Busy-wait this long (with a pause instruction) before sleeping. The latency floor when the
  // peer answers within it; CPU time burnt otherwise.
  absl::Duration spin = absl::Milliseconds(1);
  // Longest single sleep; the peer-liveness check runs at least this often while asleep.
  absl::Duration sleep_slice = absl::Milliseconds(2);
  // How often the liveness check runs while spinning.
  absl::Duration check_interval = absl::Microseconds(100);
};

enum class DoorbellWait {
  kArrived,   // the sequence reached the target
  kDeadline,  // the deadline passed first
  kAborted,   // the liveness check returned true ("give up") first
};

// Waits until *sequence >= target (acquire), the deadline passes, or should_abort() returns true.
// `waiters` is the waiter's announcement word next to the sequence; only one thread may wait on a
// given sequence at a time.
DoorbellWait WaitForSequence(uint64_t* sequence, uint32_t* waiters, uint64_t target,
                             absl::Time deadline, const DoorbellWaitOptions& options,
                             absl::FunctionRef<bool()> should_abort);

// Stores `value` (release + sequentially consistent) and wakes the waiter if it sleeps.
void PublishSequence(uint64_t* sequence, uint32_t* waiters, uint64_t value);

// Wakes a sleeper on `sequence` without changing it (used to make it re-run its abort check).
void WakeSequenceWaiters(uint64_t* sequence);

}  // namespace tandem

#endif  // TANDEM_COMMON_OFFLOAD_DOORBELL_H_
