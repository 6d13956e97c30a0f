// Several host workers (e.g. one per NUMA node), each holding one contiguous range of experts.
//
// Why expert ranges and not row splits: with experts split, every (expert, row) pair has exactly
// one owner, so each worker gets one request per layer holding all of its pairs (fewer, larger
// requests), reads only its own experts' weights (each weight byte lives in one node's memory),
// and returns finished rows: the merge is a copy into the original pair order, with no reduction
// across workers. Splitting each expert's rows (or its hidden dimension) across workers would
// either duplicate every expert's weights on every node or make each output row the sum of
// partial results from several workers.
//
// Range k of N is [k*E/N, (k+1)*E/N) (SplitExpertRanges): balanced to within one expert. Routing
// is close to uniform over experts when averaged over a batch, so equal ranges give equal work.
#ifndef TANDEM_GPU_SERVICE_OFFLOAD_MULTI_WORKER_CLIENT_H_
#define TANDEM_GPU_SERVICE_OFFLOAD_MULTI_WORKER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu_service/offload/offload_client.h"

namespace tandem {

struct ExpertRange {
  uint32_t begin = 0;  // first expert held
  uint32_t end = 0;    // one past the last
};

// N contiguous ranges covering [0, expert_count), sizes differing by at most one.
std::vector<ExpertRange> SplitExpertRanges(uint32_t expert_count, uint32_t parts);

struct WorkerShare {
  ExpertRange experts;
  OffloadClientOptions client;  // each worker's own channel (and its flags: NUMA node, range)
};

class MultiWorkerClient {
 public:
  // The ranges must cover [0, expert_count) without gaps or overlaps, in order; every share's
  // capacities must be equal (any worker may receive every pair of a request).
  static absl::StatusOr<std::unique_ptr<MultiWorkerClient>> Create(std::vector<WorkerShare> shares);

  // WaitUntilReady on every worker.
  absl::Status WaitUntilReady(absl::Time deadline);

  // Splits the pairs by owner, sends each worker its pairs (with only the activation rows they
  // reference) before waiting for any, then writes every output row to its pair's position in
  // `outputs` (pairs.size() * hidden_size floats). The first error wins; every sent request is
  // still waited for. worker_compute_ns of the result is the slowest worker's.
  absl::StatusOr<OffloadReply> Call(const OffloadRequest& request, std::span<float> outputs,
                                    absl::Time deadline);

  size_t worker_count() const { return workers_.size(); }
  OffloadClient& worker(size_t i) { return *workers_[i].client; }

 private:
  struct Worker {
    ExpertRange experts;
    std::unique_ptr<OffloadClient> client;
    // Per-call scratch, reused across calls.
    std::vector<ExpertRowPair> pairs;
    std::vector<uint32_t> original_index;  // pairs[i] is request pair original_index[i]
    std::vector<float> activations;
    bool sent = false;
  };
  MultiWorkerClient() = default;

  std::vector<Worker> workers_;
  std::vector<uint32_t> owner_;       // expert -> worker index
  std::vector<int32_t> local_row_;    // per call: request row -> row in the worker's request
  uint32_t hidden_size_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_OFFLOAD_MULTI_WORKER_CLIENT_H_
