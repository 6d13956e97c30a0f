// A small persistent pool of worker threads for the CPU reference's data-parallel loops.
//
// ParallelFor(begin, end, grain, fn) splits [begin, end) into chunks of at least `grain` indices and
// calls fn(chunk_begin, chunk_end) for each, on the pool's workers and on the calling thread, and
// returns once every chunk is done. Chunks never overlap, so fn may write disjoint outputs without
// locks. A pool of 1 thread (or a null pool, see ParallelFor below) runs everything on the caller.
// Calls from several threads at once are serialised; a ParallelFor issued from inside fn runs
// serially on the calling worker (no deadlock, no oversubscription).
#ifndef TANDEM_COMMON_REFERENCE_THREAD_POOL_H_
#define TANDEM_COMMON_REFERENCE_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace tandem {

class ThreadPool {
 public:
  // threads <= 0 means std::thread::hardware_concurrency() (at least 1). The calling thread counts
  // as one of them, so threads - 1 workers are started.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  void ParallelFor(int64_t begin, int64_t end, int64_t grain,
                   absl::FunctionRef<void(int64_t, int64_t)> fn);

 private:
  void WorkerLoop();
  // Claims and runs chunks of the current job until none is left.
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // serialises ParallelFor callers

  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // bumped per job, guarded by mu_
  int active_workers_ = 0;   // workers still inside the current job, guarded by mu_
  bool stopping_ = false;

  // The current job (written under mu_ before generation_ is bumped).
  absl::FunctionRef<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_end_ = 0;
  int64_t job_chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

// Runs on `pool` when it is non-null, else serially on the caller.
void ParallelFor(ThreadPool* pool, int64_t begin, int64_t end, int64_t grain,
                 absl::FunctionRef<void(int64_t, int64_t)> fn);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_THREAD_POOL_H_
