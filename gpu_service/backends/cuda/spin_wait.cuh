// Timed spin waits: a thread that waits for another block's write (a count, a polled value, an
// mbarrier phase) gives up after kSpinWaitTimeoutNs and traps, so that a writer that never comes
// (a bug: a block not co-resident, a count never made) fails the launch with an error instead of
// hanging the stream. Device code only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_SPIN_WAIT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_SPIN_WAIT_CUH_

#include "gpu_service/backends/cuda/global_timer.cuh"

namespace tandem::cuda {

// Far past any wait a correct step makes (microseconds), short enough that a test sees the trap.
inline constexpr unsigned long long kSpinWaitTimeoutNs = 2'000'000'000ull;

// Returns once ready() holds. One try first, without the timer (the path a step takes), then
// tries until it holds, kSleepNs apart (0: no sleep, for a ready() that suspends the thread
// itself, as mbarrier try_wait does), trapping past kSpinWaitTimeoutNs. ready() does the loads
// with the ordering the caller needs (acquire, relaxed) and may keep what it read.
template <unsigned kSleepNs, typename Ready>
__device__ __forceinline__ void SpinUntil(Ready&& ready) {
  if (ready()) return;
  const unsigned long long start = GlobalTimerNs();
  while (!ready()) {
    if constexpr (kSleepNs > 0) __nanosleep(kSleepNs);
    if (GlobalTimerNs() - start > kSpinWaitTimeoutNs) __trap();
  }
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_SPIN_WAIT_CUH_
