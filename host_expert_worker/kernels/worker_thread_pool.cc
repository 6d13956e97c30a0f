#include "host_expert_worker/kernels/worker_thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <string>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status PinTo(pthread_t thread, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (int rc = pthread_setaffinity_np(thread, sizeof(set), &set); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot pin a thread to CPU ", cpu, " (error ", rc, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text) {
  std::vector<int> cpus;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> ends = absl::StrSplit(item, '-');
    int first = 0, last = 0;
    const bool ok = ends.size() <= 2 && absl::SimpleAtoi(ends[0], &first) &&
                    absl::SimpleAtoi(ends.back(), &last) && first >= 0 && last >= first &&
                    last < CPU_SETSIZE;
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("--cpus: bad item '", std::string(item),
                                                     "' (expected N or N-M, 0 <= N <= M)"));
    }
    for (int c = first; c <= last; ++c) cpus.push_back(c);
  }
  if (cpus.empty()) return absl::InvalidArgumentError("--cpus: the list is empty");
  return cpus;
}

WorkerThreadPool::WorkerThreadPool(const WorkerThreadPoolOptions& options)
    : threads_(options.threads), spin_ns_(absl::ToInt64Nanoseconds(options.spin)) {}

absl::StatusOr<std::unique_ptr<WorkerThreadPool>> WorkerThreadPool::Create(
    const WorkerThreadPoolOptions& options) {
  if (options.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads = ", options.threads, " must be >= 1"));
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (!options.cpus.empty()) {
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
      return absl::InternalError("sched_getaffinity failed");
    }
    for (int cpu : options.cpus) {
      if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed)) {
        return absl::InvalidArgumentError(
            absl::StrCat("CPU ", cpu, " is not one this process may run on (see --cpus)"));
      }
    }
    if (absl::Status s = PinTo(pthread_self(), options.cpus[0]); !s.ok()) return s;
  }
  std::unique_ptr<WorkerThreadPool> pool(new WorkerThreadPool(options));
  for (int t = 1; t < options.threads; ++t) {
    // std::thread reports a thread the system will not start only by throwing; the threads
    // started so far are joined by the pool's destructor on this return.
    try {
      pool->workers_.emplace_back([p = pool.get(), t] { p->WorkerLoop(t); });
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "threads = ", options.threads, ": the system would not start thread ", t, " (",
          e.what(), ")"));
    }
    if (!options.cpus.empty()) {
      const int cpu = options.cpus[static_cast<size_t>(t) % options.cpus.size()];
      if (absl::Status s = PinTo(pool->workers_.back().native_handle(), cpu); !s.ok()) return s;
    }
  }
  return pool;
}

WorkerThreadPool::~WorkerThreadPool() {
  stopping_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void WorkerThreadPool::WorkerLoop(int t) {
  uint32_t seen = 0;
  for (;;) {
    // Wait for a new generation: spin, then sleep on the futex.
    const int64_t spin_until = NowNs() + spin_ns_;
    uint32_t g = generation_.load(std::memory_order_acquire);
    while (g == seen && NowNs() < spin_until) {
      for (int i = 0; i < 64; ++i) CpuRelax();
      g = generation_.load(std::memory_order_acquire);
    }
    while (g == seen) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      generation_.wait(seen, std::memory_order_seq_cst);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stopping_.load(std::memory_order_acquire)) return;
    (*job_)(t);
    finished_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void WorkerThreadPool::Run(absl::FunctionRef<void(int)> fn) {
  job_ = &fn;
  finished_.store(0, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
  fn(0);
  int spins = 0;
  while (finished_.load(std::memory_order_acquire) != threads_ - 1) {
    CpuRelax();
    // On an oversubscribed machine, let a preempted worker run.
    if (++spins % 4096 == 0) std::this_thread::yield();
  }
  job_ = nullptr;
}

void WorkerThreadPool::Barrier() {
  if (threads_ == 1) return;
  const uint32_t phase = barrier_phase_.load(std::memory_order_acquire);
  if (barrier_count_.fetch_add(1, std::memory_order_acq_rel) == threads_ - 1) {
    barrier_count_.store(0, std::memory_order_relaxed);
    barrier_phase_.store(phase + 1, std::memory_order_release);
    return;
  }
  int spins = 0;
  while (barrier_phase_.load(std::memory_order_acquire) == phase) {
    CpuRelax();
    if (++spins % 4096 == 0) std::this_thread::yield();
  }
}

}  // namespace tandem
