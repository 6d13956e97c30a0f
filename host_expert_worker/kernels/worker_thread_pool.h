// The expert worker's compute threads: a fixed team, each pinned to one CPU, that runs one job at
// a time with every thread taking part (the calling thread is thread 0).
//
// Run(fn) calls fn(t) on threads t = 0 .. size() - 1 and returns when all have returned; inside fn,
// Barrier() waits for the whole team (phases of one request). Between jobs the workers spin for
// `spin` (the next MoE layer's request usually follows within it) and then sleep on a futex, so
// an idle worker costs no CPU. No allocation and no system call on the hot path while spinning.
#ifndef TANDEM_HOST_EXPERT_WORKER_KERNELS_WORKER_THREAD_POOL_H_
#define TANDEM_HOST_EXPERT_WORKER_KERNELS_WORKER_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

struct WorkerThreadPoolOptions {
  int threads = 1;         // team size, including the calling thread
  std::vector<int> cpus;   // thread t is pinned to cpus[t % cpus.size()]; empty: not pinned
  absl::Duration spin = absl::Microseconds(500);  // idle spin before sleeping
};

class WorkerThreadPool {
 public:
  // Starts threads - 1 workers and pins them (and, when cpus is non-empty, the calling thread to
  // cpus[0]). Errors: threads < 1, or a CPU this process may not run on (InvalidArgument naming it).
  static absl::StatusOr<std::unique_ptr<WorkerThreadPool>> Create(const WorkerThreadPoolOptions& options);
  ~WorkerThreadPool();
  WorkerThreadPool(const WorkerThreadPool&) = delete;
  WorkerThreadPool& operator=(const WorkerThreadPool&) = delete;

  int size() const { return threads_; }

  // Runs fn(t) on every thread of the team. Call from the creating thread only, not concurrently.
  void Run(absl::FunctionRef<void(int)> fn);
  // Only inside Run's fn, called by every thread the same number of times.
  void Barrier();

 private:
  explicit WorkerThreadPool(const WorkerThreadPoolOptions& options);
  void WorkerLoop(int t);

  const int threads_;
  const int64_t spin_ns_;
  std::vector<std::thread> workers_;
  absl::FunctionRef<void(int)>* job_ = nullptr;

  alignas(64) std::atomic<uint32_t> generation_{0};  // bumped per job; workers wait on it
  alignas(64) std::atomic<int> sleepers_{0};
  alignas(64) std::atomic<int> finished_{0};
  alignas(64) std::atomic<int> barrier_count_{0};
  alignas(64) std::atomic<uint32_t> barrier_phase_{0};
  std::atomic<bool> stopping_{false};
};

// Parses a CPU list such as "0-7,16,18-19" (InvalidArgument naming the bad item).
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text);

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_KERNELS_WORKER_THREAD_POOL_H_
