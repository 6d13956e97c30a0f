// The Backend: what the engine needs from a device to advance sequences (docs/ARCHITECTURE.md,
// "Interfaces that hold the design together"). The engine decides what runs (scheduler) and what
// is sampled; a backend only does the math of one step for a batch of sequence slots.
//
// Implementations: CpuBackend (cpu_backend.h, the CPU reference engine) and, later, the CUDA
// backend. Tests run the same engine over either, or over a fake.
//
// Threading: CreateSequence, ReleaseSequence, Step and KeepFirst are called from one thread at a
// time (the engine's step thread). The const accessors, state_usage() and placement() may be
// called from any thread at any time (the metrics endpoint reads them).
#ifndef TANDEM_GPU_SERVICE_BACKEND_BACKEND_H_
#define TANDEM_GPU_SERVICE_BACKEND_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// A sequence's state slot inside a backend. Only meaningful to the backend that made it.
using SequenceSlot = int64_t;

// Pages of per-sequence state in use (docs: state slots). max_pages = 0: unbounded.
struct StateUsage {
  int64_t pages_in_use = 0;
  int64_t max_pages = 0;
};

// Where routed-expert rows were computed, totals since the backend started. "Local" is the
// backend's own device (the GPU for CUDA, the service's threads for CPU); "worker" is the host
// expert workers. Admissions / evictions / admitted bytes come from an expert cache (zero for a
// backend without one).
struct ExpertPlacementTotals {
  uint64_t local_rows = 0;
  uint64_t worker_rows = 0;
  uint64_t admissions = 0;
  uint64_t evictions = 0;
  uint64_t bytes_to_workers = 0;    // activation rows sent to workers
  uint64_t bytes_from_workers = 0;  // output rows received
  uint64_t bytes_admitted = 0;      // expert weights copied into the local cache
  double worker_seconds = 0;        // wall time spent waiting for workers
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda".
  virtual std::string name() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  // Weights of the served model (elements of every tensor), for ModelInfo.
  virtual uint64_t parameter_count() const = 0;

  // A fresh slot at length 0. ResourceExhausted when the state pool is full.
  virtual absl::StatusOr<SequenceSlot> CreateSequence() = 0;
  // Returns the slot's state to the pool. Unknown slots are ignored.
  virtual void ReleaseSequence(SequenceSlot slot) = 0;

  struct StepInput {
    SequenceSlot slot = 0;
    std::span<const int32_t> tokens;  // appended at the slot's current length; non-empty
    // vocab floats for the last new position (tokens.size() × vocab with all_positions);
    // nullptr: this sequence needs no logits this step (a prefill chunk that is not the last).
    float* logits = nullptr;
    bool all_positions = false;
    // false: KeepFirst will not be called after this step, so a backend may skip saving the state
    // it would need to rewind (the CUDA backend copies every recurrent state of the sequence for it).
    bool rewindable = true;
  };
  // Advances every input's slot by its tokens, all inputs batched together. Each slot appears at
  // most once. ResourceExhausted means the backend has no room for the whole step (its KV cache
  // is full) and changed nothing: the engine preempts a sequence and retries. On any other error,
  // the slots named in `inputs` are in an unspecified state (the engine ends their requests);
  // other slots are untouched.
  virtual absl::Status Step(std::span<const StepInput> inputs) = 0;

  // Host memory for StepInput::logits, `floats` long, of the kind this backend fills fastest: the
  // CUDA backend's is page-locked (the head's rows are copied straight into it instead of through a
  // staging buffer and a host copy); the default is plain heap memory. Null when none can be had.
  struct LogitsDeleter {
    void (*free)(float*) = nullptr;
    void operator()(float* p) const {
      if (free != nullptr) free(p);
    }
  };
  using LogitsBuffer = std::unique_ptr<float[], LogitsDeleter>;
  virtual LogitsBuffer AllocateLogits(size_t floats) {
    return LogitsBuffer(new (std::nothrow) float[floats], LogitsDeleter{[](float* p) { delete[] p; }});
  }

  // Keeps only the first m positions of the slot's last Step chunk (speculative verification).
  virtual absl::Status KeepFirst(SequenceSlot slot, int64_t m) = 0;

  virtual StateUsage state_usage() const = 0;
  virtual ExpertPlacementTotals placement() const = 0;

  // Health: a backend that loses a piece it depends on (a host worker) reports false, and true
  // once it is whole again. The server maps this to the gRPC health status. The listener is
  // called from whichever thread noticed the change; it must be cheap and must not call back
  // into the backend.
  using HealthListener = std::function<void(bool serving)>;
  void SetHealthListener(HealthListener listener) {
    std::lock_guard<std::mutex> lock(health_mu_);
    health_listener_ = std::move(listener);
    if (health_listener_) health_listener_(healthy_);
  }
  bool healthy() const {
    std::lock_guard<std::mutex> lock(health_mu_);
    return healthy_;
  }

 protected:
  // Implementations call this on every change of health.
  void ReportHealth(bool serving) {
    std::lock_guard<std::mutex> lock(health_mu_);
    if (serving == healthy_) return;
    healthy_ = serving;
    if (health_listener_) health_listener_(serving);
  }

 private:
  mutable std::mutex health_mu_;
  bool healthy_ = true;
  HealthListener health_listener_;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_BACKEND_BACKEND_H_
