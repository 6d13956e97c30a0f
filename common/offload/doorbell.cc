#include "common/offload/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>

#include "common/offload/channel_layout.h"

namespace tandem {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no syscall
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// The futex word is the low half of the 64-bit sequence (little-endian, checked in
// channel_layout.h). Shared (not FUTEX_PRIVATE) because the waker is another process.
uint32_t* FutexWord(uint64_t* sequence) { return reinterpret_cast<uint32_t*>(sequence); }

void FutexWait(uint64_t* sequence, uint32_t expected_low, int64_t timeout_ns) {
  timespec ts;
  ts.tv_sec = timeout_ns / 1000000000;
  ts.tv_nsec = timeout_ns % 1000000000;
  syscall(SYS_futex, FutexWord(sequence), FUTEX_WAIT, expected_low, &ts, nullptr, 0);
}

void FutexWakeAll(uint64_t* sequence) {
  syscall(SYS_futex, FutexWord(sequence), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

DoorbellWait WaitForSequence(uint64_t* sequence, uint32_t* waiters, uint64_t target,
                             absl::Time deadline, const DoorbellWaitOptions& options,
                             absl::FunctionRef<bool()> should_abort) {
  std::atomic_ref<uint64_t> seq(*sequence);
  if (seq.load(std::memory_order_acquire) >= target) return DoorbellWait::kArrived;

  const int64_t start = MonotonicNanos();
  // absl::Time is wall-clock; translate the deadline once onto the monotonic clock.
  const absl::Duration until_deadline = deadline - absl::Now();
  const int64_t deadline_ns = until_deadline > absl::Hours(24 * 365)
                                  ? INT64_MAX
                                  : start + absl::ToInt64Nanoseconds(until_deadline);
  const int64_t spin_end = std::min(deadline_ns, start + absl::ToInt64Nanoseconds(options.spin));
  const int64_t check_ns = std::max<int64_t>(1000, absl::ToInt64Nanoseconds(options.check_interval));

  // Spin phase: only loads, pause, and a vDSO clock read every 64 iterations.
  int64_t next_check = start + check_ns;
  for (uint32_t i = 1;; ++i) {
    if (seq.load(std::memory_order_acquire) >= target) return DoorbellWait::kArrived;
    CpuRelax();
    if ((i & 63) != 0) continue;
    const int64_t now = MonotonicNanos();
    if (now >= next_check) {
      if (should_abort()) return DoorbellWait::kAborted;
      next_check = now + check_ns;
    }
    if (now >= spin_end) break;
  }

  // Sleep phase.
  std::atomic_ref<uint32_t> waiting(*waiters);
  const int64_t slice_ns = std::max<int64_t>(1000, absl::ToInt64Nanoseconds(options.sleep_slice));
  for (;;) {
    const int64_t now = MonotonicNanos();
    if (seq.load(std::memory_order_acquire) >= target) return DoorbellWait::kArrived;
    if (now >= deadline_ns) return DoorbellWait::kDeadline;
    if (should_abort()) return DoorbellWait::kAborted;
    waiting.store(1, std::memory_order_seq_cst);
    const uint64_t observed = seq.load(std::memory_order_seq_cst);
    if (observed >= target) {
      waiting.store(0, std::memory_order_relaxed);
      return DoorbellWait::kArrived;
    }
    FutexWait(sequence, static_cast<uint32_t>(observed), std::min(slice_ns, deadline_ns - now));
    waiting.store(0, std::memory_order_relaxed);
  }
}

void PublishSequence(uint64_t* sequence, uint32_t* waiters, uint64_t value) {
  std::atomic_ref<uint64_t>(*sequence).store(value, std::memory_order_seq_cst);
  if (std::atomic_ref<uint32_t>(*waiters).load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(sequence);
  }
}

void WakeSequenceWaiters(uint64_t* sequence) { FutexWakeAll(sequence); }

}  // namespace tandem
