// The text form of one host worker in tandem-gpu-service's flags (--worker, --connect-worker).
//
// A spec is a comma-separated list of key=value items:
//   share=K/N   this worker holds expert range K of N (required when there are several workers;
//               with one worker it defaults to 0/1)
//   numa=N      bind the worker's expert memory and threads to NUMA node N (spawned only)
//   cpus=LIST   pin its compute threads to these CPUs, e.g. cpus=0-7 or cpus=0-3,8-11 (spawned
//               only)
//   threads=N   compute threads (spawned only; default: one per CPU of cpus)
//   isa=NAME    kernel family: auto, scalar, avx2, avx512vnni (spawned only)
// An item without '=' continues the previous value, so a CPU list may hold commas:
// "share=0/2,numa=0,cpus=0-3,8-11,threads=8" is {share 0/2, numa 0, cpus 0-3,8-11, threads 8}.
// The empty spec is {share 0/1}.
#ifndef TANDEM_GPU_SERVICE_BACKEND_REMOTE_EXPERTS_SPEC_H_
#define TANDEM_GPU_SERVICE_BACKEND_REMOTE_EXPERTS_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct RemoteWorkerSpec {
  int share_index = 0;  // K
  int share_count = 1;  // N
  bool share_given = false;
  // true: the service starts the worker (--worker); false: a worker started by hand attaches to
  // the channel the service creates (--connect-worker).
  bool spawn = true;
  int numa_node = -1;  // -1: no binding
  std::string cpus;    // empty: the worker's default
  int threads = 0;     // 0: the worker's default
  std::string isa;     // empty: the worker's default (auto)
  std::string text;    // as given, for messages

  std::string share_text() const;  // "K/N"
};

// Parses one spec. `flag` ("--worker" or "--connect-worker") names the flag in errors, which also
// name the bad item. Binding keys (numa, cpus, threads, isa) are refused for --connect-worker:
// a hand-started worker takes them on its own command line.
absl::StatusOr<RemoteWorkerSpec> ParseRemoteWorkerSpec(const std::string& text, bool spawn,
                                                       const std::string& flag);

// Checks a whole set (spawned and connected together): with one worker its share defaults to
// 0/1; with several, every spec must give share=K/N with the same N equal to the number of
// workers, and each K once. Returns the specs ordered by K (the order of the expert ranges).
absl::StatusOr<std::vector<RemoteWorkerSpec>> OrderWorkerShares(std::vector<RemoteWorkerSpec> specs);

// The worker's command-line flags for a spawned spec (without --channel, which the offload client
// appends): --model, --share, and the binding flags that were given; --exact when exact.
std::vector<std::string> WorkerArguments(const RemoteWorkerSpec& spec, const std::string& model,
                                         bool exact);

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_BACKEND_REMOTE_EXPERTS_SPEC_H_
