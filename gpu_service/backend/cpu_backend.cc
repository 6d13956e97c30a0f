#include "gpu_service/backend/cpu_backend.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem {

// The ExpertExecutor of one layer: splits the (expert, token) pairs by placement, runs the local
// ones with the reference executor and the others on the remote, and puts every output row back
// at its pair's position.
class CpuBackend::SplitExecutor : public ExpertExecutor {
 public:
  SplitExecutor(CpuBackend* backend, int64_t layer)
      : backend_(backend),
        layer_(layer),
        local_(backend->model_->weights().layers[layer].moe, backend->model_->threads()) {}

  absl::Status Run(std::span<const ExpertWork> work, const float* x, int64_t h,
                   float* out) override {
    const StaticExpertPlacement& placement = backend_->placement_;
    if (placement.all_local() || backend_->options_.remote == nullptr) {
      backend_->local_rows_ += work.size();
      return local_.Run(work, x, h, out);
    }
    local_work_.clear();
    remote_work_.clear();
    local_index_.clear();
    remote_index_.clear();
    for (size_t i = 0; i < work.size(); ++i) {
      if (placement.IsLocal(layer_, work[i].expert)) {
        local_work_.push_back(work[i]);
        local_index_.push_back(i);
      } else {
        remote_work_.push_back(work[i]);
        remote_index_.push_back(i);
      }
    }
    if (!remote_work_.empty()) {
      scratch_.resize(remote_work_.size() * h);
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status s = backend_->options_.remote->Run(layer_, remote_work_, x, h, scratch_.data());
      backend_->worker_nanos_ += static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                               t0)
              .count());
      if (!s.ok()) return s;
      const uint64_t row_bytes = static_cast<uint64_t>(h) * sizeof(float);
      backend_->worker_rows_ += remote_work_.size();
      backend_->bytes_to_workers_ += remote_work_.size() * row_bytes;
      backend_->bytes_from_workers_ += remote_work_.size() * row_bytes;
      for (size_t j = 0; j < remote_index_.size(); ++j) {
        std::memcpy(out + remote_index_[j] * h, scratch_.data() + j * h, row_bytes);
      }
    }
    if (!local_work_.empty()) {
      scratch_.resize(local_work_.size() * h);
      if (absl::Status s = local_.Run(local_work_, x, h, scratch_.data()); !s.ok()) return s;
      backend_->local_rows_ += local_work_.size();
      for (size_t j = 0; j < local_index_.size(); ++j) {
        std::memcpy(out + local_index_[j] * h, scratch_.data() + j * h, h * sizeof(float));
      }
    }
    return absl::OkStatus();
  }

 private:
  CpuBackend* backend_;
  int64_t layer_;
  ReferenceExpertExecutor local_;
  std::vector<ExpertWork> local_work_, remote_work_;
  std::vector<size_t> local_index_, remote_index_;
  std::vector<float> scratch_;
};

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Open(const std::string& model_path,
                                                             const CpuBackendOptions& options) {
  absl::StatusOr<std::unique_ptr<ReferenceModel>> model =
      ReferenceModel::Open(model_path, options.model);
  if (!model.ok()) return model.status();
  return Create(*std::move(model), options);
}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(
    std::unique_ptr<ReferenceModel> model, const CpuBackendOptions& options) {
  StaticExpertPlacement placement = StaticExpertPlacement::FromBudget(
      model->weights(), model->config().moe.E, options.expert_budget);
  if (!placement.all_local() && options.remote == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-expert-budget: the budget keeps ", placement.local_count(), " of ",
        placement.local_count() + placement.remote_count(),
        " routed experts local; the rest need host workers (--worker or --connect-worker)"));
  }
  return std::unique_ptr<CpuBackend>(
      new CpuBackend(std::move(model), options, std::move(placement)));
}

CpuBackend::CpuBackend(std::unique_ptr<ReferenceModel> model, const CpuBackendOptions& options,
                       StaticExpertPlacement placement)
    : model_(std::move(model)),
      options_(options),
      placement_(std::move(placement)),
      pool_(&model_->state_pool()) {
  for (const GgufTensorInfo& t : model_->file().tensors()) {
    parameter_count_ += static_cast<uint64_t>(t.n_elements);
  }
  const int64_t layers = static_cast<int64_t>(model_->weights().layers.size());
  for (int64_t l = 0; l < layers; ++l) {
    executors_.push_back(std::make_unique<SplitExecutor>(this, l));
  }
}

CpuBackend::~CpuBackend() { slots_.clear(); }

absl::StatusOr<SequenceSlot> CpuBackend::CreateSequence() {
  absl::StatusOr<std::unique_ptr<SequenceState>> seq = model_->NewSequence();
  if (!seq.ok()) return seq.status();
  const SequenceSlot slot = next_slot_++;
  slots_[slot] = Slot{*std::move(seq), options_.remote != nullptr ? options_.remote->losses() : 0};
  return slot;
}

void CpuBackend::ReleaseSequence(SequenceSlot slot) { slots_.erase(slot); }

absl::Status CpuBackend::Step(std::span<const StepInput> inputs) {
  std::vector<ReferenceModel::Step> steps;
  steps.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto it = slots_.find(inputs[i].slot);
    if (it == slots_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step input ", i, ": unknown sequence slot ", inputs[i].slot));
    }
    if (options_.remote != nullptr && it->second.worker_losses != options_.remote->losses()) {
      return absl::UnavailableError(absl::StrCat(
          "step input ", i, ": a host expert worker was lost while sequence ", inputs[i].slot,
          " was running"));
    }
    steps.push_back(ReferenceModel::Step{it->second.state.get(), inputs[i].tokens,
                                         inputs[i].logits, inputs[i].all_positions});
  }
  ReferenceModel::ForwardOptions forward;
  forward.experts = [this](int64_t layer) -> ExpertExecutor* {
    return executors_[static_cast<size_t>(layer)].get();
  };
  absl::Status s = model_->Forward(std::span(steps), forward);
  // A lost worker makes the backend unhealthy until a step succeeds again.
  if (absl::IsUnavailable(s)) ReportHealth(false);
  if (s.ok()) ReportHealth(true);
  return s;
}

absl::Status CpuBackend::KeepFirst(SequenceSlot slot, int64_t m) {
  auto it = slots_.find(slot);
  if (it == slots_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown sequence slot ", slot));
  }
  return model_->KeepFirst(it->second.state.get(), m);
}

StateUsage CpuBackend::state_usage() const {
  return StateUsage{pool_->pages_in_use(), pool_->max_pages()};
}

ExpertPlacementTotals CpuBackend::placement() const {
  ExpertPlacementTotals t;
  t.local_rows = local_rows_.load();
  t.worker_rows = worker_rows_.load();
  // The workers' client counts the rows it actually sends; without it, one row per pair.
  const std::optional<uint64_t> sent =
      options_.remote != nullptr ? options_.remote->activation_bytes_sent() : std::nullopt;
  t.bytes_to_workers = sent.has_value() ? *sent : bytes_to_workers_.load();
  t.bytes_from_workers = bytes_from_workers_.load();
  t.worker_seconds = static_cast<double>(worker_nanos_.load()) * 1e-9;
  return t;
}

}  // namespace tandem
