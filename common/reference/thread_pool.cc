#include "common/reference/thread_pool.h"

#include <algorithm>

namespace tandem {
namespace {

// True on a thread that is currently running a chunk of some pool's job.
thread_local bool tls_inside_pool_job = false;

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int i = 0; i + 1 < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  const bool was_inside = tls_inside_pool_job;
  tls_inside_pool_job = true;
  for (;;) {
    const int64_t b = next_.fetch_add(job_chunk_, std::memory_order_relaxed);
    if (b >= job_end_) break;
    (*job_)(b, std::min(job_end_, b + job_chunk_));
  }
  tls_inside_pool_job = was_inside;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    RunChunks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_workers_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t begin, int64_t end, int64_t grain,
                             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (end <= begin) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t total = end - begin;
  if (workers_.empty() || tls_inside_pool_job || total <= grain) {
    fn(begin, end);
    return;
  }
  // About four chunks per thread balances uneven chunk costs without much claiming overhead.
  const int64_t chunk = std::max(grain, (total + 4 * threads() - 1) / (4 * threads()));
  // Chunks are claimed as offsets from 0 so that next_ can start at 0.
  auto shifted = [&](int64_t b, int64_t e) { fn(begin + b, begin + e); };
  absl::FunctionRef<void(int64_t, int64_t)> shifted_ref(shifted);

  std::lock_guard<std::mutex> call_lock(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &shifted_ref;
    job_end_ = total;
    job_chunk_ = chunk;
    next_.store(0, std::memory_order_relaxed);
    active_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  RunChunks();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return active_workers_ == 0; });
  job_ = nullptr;
}

void ParallelFor(ThreadPool* pool, int64_t begin, int64_t end, int64_t grain,
                 absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (pool == nullptr) {
    if (end > begin) fn(begin, end);
    return;
  }
  pool->ParallelFor(begin, end, grain, fn);
}

}  // namespace tandem
