// The CPU backend: the Backend interface over the CPU reference engine (ReferenceModel). It runs
// the same service end to end without a GPU (CI, development, small models).
//
// Routed experts: the MoE step of every layer is split by a StaticExpertPlacement. Rows of local
// experts run here (the reference expert executor); rows of the others go to `remote` (the host
// workers). With no `remote`, the placement must be all-local. Rows and worker time are counted
// for the metrics (placement()).
//
// A lost worker (RemoteExperts::losses() moved) fails the step of every sequence created before
// the loss with Unavailable, whichever thread noticed the loss and whether or not the worker is
// back: such a sequence was in flight when the worker died, and the service's contract is that
// in-flight requests then end with UNAVAILABLE (the engine ends the whole step's batch).
#ifndef TANDEM_GPU_SERVICE_BACKEND_CPU_BACKEND_H_
#define TANDEM_GPU_SERVICE_BACKEND_CPU_BACKEND_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/model/reference_model.h"
#include "gpu_service/backend/backend.h"
#include "gpu_service/backend/expert_placement.h"

namespace tandem {

struct CpuBackendOptions {
  ReferenceModelOptions model;  // threads, state page limit
  // Experts inside the budget are computed here, the rest by `remote`. Default: everything here.
  ExpertBudget expert_budget = ExpertBudget::All();
  // Not owned; must outlive the backend. Required when the budget leaves experts out.
  RemoteExperts* remote = nullptr;
};

class CpuBackend : public Backend {
 public:
  // Loads the model. InvalidArgument when the budget leaves experts out and there is no remote.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Open(const std::string& model_path,
                                                          const CpuBackendOptions& options);
  // Over an already open model (tests).
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(std::unique_ptr<ReferenceModel> model,
                                                            const CpuBackendOptions& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return model_->config(); }
  const Tokenizer& tokenizer() const override { return model_->tokenizer(); }
  uint64_t parameter_count() const override { return parameter_count_; }

  absl::StatusOr<SequenceSlot> CreateSequence() override;
  void ReleaseSequence(SequenceSlot slot) override;
  absl::Status Step(std::span<const StepInput> inputs) override;
  absl::Status KeepFirst(SequenceSlot slot, int64_t m) override;
  StateUsage state_usage() const override;
  ExpertPlacementTotals placement() const override;

  const StaticExpertPlacement& expert_placement() const { return placement_; }
  ReferenceModel& model() { return *model_; }

 private:
  class SplitExecutor;
  CpuBackend(std::unique_ptr<ReferenceModel> model, const CpuBackendOptions& options,
             StaticExpertPlacement placement);

  std::unique_ptr<ReferenceModel> model_;
  CpuBackendOptions options_;
  StaticExpertPlacement placement_;
  std::vector<std::unique_ptr<SplitExecutor>> executors_;  // per layer
  StatePool* pool_;  // the model's
  uint64_t parameter_count_ = 0;
  struct Slot {
    std::unique_ptr<SequenceState> state;
    // options_.remote->losses() when the sequence was created: a sequence that was running when
    // a worker was lost is ended, even if the worker came back before its next step.
    uint64_t worker_losses = 0;
  };
  absl::flat_hash_map<SequenceSlot, Slot> slots_;
  SequenceSlot next_slot_ = 1;

  // Totals, written by the step thread, read by anyone.
  std::atomic<uint64_t> local_rows_{0}, worker_rows_{0}, bytes_to_workers_{0},
      bytes_from_workers_{0};
  std::atomic<uint64_t> worker_nanos_{0};
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_BACKEND_CPU_BACKEND_H_
