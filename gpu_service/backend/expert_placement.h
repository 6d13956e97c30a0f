// Which routed experts a backend computes itself and which go to host workers.
//
// --gpu-expert-budget is parsed into an ExpertBudget (bytes, or a fraction of all routed expert
// bytes). StaticExpertPlacement turns it into a per-(layer, expert) mask: experts are taken
// expert-major across layers (expert 0 of every layer, then expert 1, ...) until the budget is
// spent, so every layer keeps about the same share locally. It is a pure object (no device, no
// I/O) so the policy is testable on its own; the CPU backend splits each MoE step by it.
//
// RemoteExperts is the seam where the host workers plug in: the CPU backend hands it the rows of
// non-local experts, and it computes them elsewhere (gpu_service/offload's clients).
#ifndef TANDEM_GPU_SERVICE_BACKEND_EXPERT_PLACEMENT_H_
#define TANDEM_GPU_SERVICE_BACKEND_EXPERT_PLACEMENT_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_weights.h"
#include "common/reference/moe.h"

namespace tandem {

struct ExpertBudget {
  // Exactly one applies: fraction >= 0 when given as a fraction, else bytes.
  double fraction = -1;
  uint64_t bytes = 0;

  static ExpertBudget All() { return ExpertBudget{1.0, 0}; }
  // The budget in bytes, given the bytes of all routed experts.
  uint64_t Resolve(uint64_t all_expert_bytes) const;
};

// Parses "0.5" / "50%" (a fraction in [0, 1]) or "12345", "64MiB", "3GB", "2G" (bytes; K/M/G/T
// with an optional "iB" are binary, "KB"/"MB"/"GB"/"TB" are decimal). InvalidArgument naming
// --gpu-expert-budget and the text for anything else.
absl::StatusOr<ExpertBudget> ParseExpertBudget(const std::string& text);

// Bytes of one routed expert of a layer (gate + up + down slices).
uint64_t ExpertBytes(const MoeWeights& moe);

class StaticExpertPlacement {
 public:
  // Every routed expert local.
  static StaticExpertPlacement AllLocal(int64_t layers, int64_t experts);
  // Local experts chosen by the budget, over the MoE layers of `weights` (layers without routed
  // experts hold none).
  static StaticExpertPlacement FromBudget(const ModelWeights& weights, int64_t experts,
                                          const ExpertBudget& budget);

  bool IsLocal(int64_t layer, int32_t expert) const {
    return local_[static_cast<size_t>(layer * experts_ + expert)] != 0;
  }
  bool all_local() const { return remote_count_ == 0; }
  int64_t local_count() const { return local_count_; }
  int64_t remote_count() const { return remote_count_; }
  uint64_t local_bytes() const { return local_bytes_; }
  uint64_t all_bytes() const { return all_bytes_; }

 private:
  int64_t layers_ = 0, experts_ = 0;
  std::vector<uint8_t> local_;  // layers × experts
  int64_t local_count_ = 0, remote_count_ = 0;
  uint64_t local_bytes_ = 0, all_bytes_ = 0;
};

// Computes routed-expert rows somewhere else (host workers). Called from the backend's step
// thread only.
class RemoteExperts {
 public:
  virtual ~RemoteExperts() = default;
  // For every i, writes FFN_{work[i].expert}(x row work[i].token) of MoE layer `layer` to
  // out + i·h (the ExpertExecutor contract, common/reference/moe.h). An error fails the step;
  // Unavailable means a worker is lost (the backend then reports itself unhealthy).
  virtual absl::Status Run(int64_t layer, std::span<const ExpertWork> work, const float* x,
                           int64_t h, float* out) = 0;
  // Activation bytes sent to workers so far (the rows actually written into requests), or nullopt
  // when the implementation does not count them (the caller then estimates one row per pair).
  virtual std::optional<uint64_t> activation_bytes_sent() const { return std::nullopt; }
  // How many times a worker has been lost so far (0 for an implementation that never loses one).
  // The backend ends a sequence that was running when this count moved, even if the worker came
  // back before the sequence's next call (see CpuBackend::Step).
  virtual uint64_t losses() const { return 0; }
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_BACKEND_EXPERT_PLACEMENT_H_
