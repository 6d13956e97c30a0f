// The prefill expert path: per expert, its weights dequantized to bf16, its token rows gathered
// as bf16, and two cuBLAS GEMMs with f32 accumulation (gate and up as one [2I × h] product, then
// down), SiLU(gate)·up rounded to bf16 in between. Tolerance against the reference: relative L2
// about 1e-2 (bf16 operands).
//
// Consumes the same ExpertUnits as the decode path (MoeStepPlan::units): consecutive units of one
// expert with consecutive slots are run as one GEMM group.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/moe/experts.h"

namespace tandem::cuda {

// One expert's contiguous run of slots.
struct PrefillGroup {
  ExpertLocation where;
  int32_t first_slot;
  int32_t rows;
};

// Merges consecutive units of one expert whose slots follow each other.
std::vector<PrefillGroup> GroupUnits(std::span<const ExpertUnit> units);

class ExpertPrefillRunner {
 public:
  // max_slots bounds the slots of one call (and so the rows of any one expert).
  static absl::StatusOr<ExpertPrefillRunner> Create(const ExpertDecodeRunner::Shape& shape, int64_t max_slots);
  ExpertPrefillRunner(ExpertPrefillRunner&&) noexcept;
  ExpertPrefillRunner& operator=(ExpertPrefillRunner&&) noexcept;
  ~ExpertPrefillRunner();

  // partial[slot] (h wide) = FFN_expert(x[input row]) for every row of every unit; x is the MoE
  // input (device, h wide rows). Enqueued on `stream`; the units' token indices are staged through
  // pinned memory (one copy).
  absl::Status Run(std::span<const ExpertUnit> units, const float* x, float* partial, cudaStream_t stream);

 private:
  ExpertPrefillRunner() = default;
  struct Blas;
  ExpertDecodeRunner::Shape shape_{};
  int64_t max_slots_ = 0;
  std::unique_ptr<Blas> blas_;
  DeviceBuffer w_gate_up_;  // bf16 [2I × h]
  DeviceBuffer w_down_;     // bf16 [h × I]
  DeviceBuffer x_rows_;     // bf16 [max_slots × h]
  DeviceBuffer gu_;         // f32 [max_slots × 2I]
  DeviceBuffer act_;        // bf16 [max_slots × I]
  DeviceBuffer index_;      // int32 [max_slots]: input row of each slot
  PinnedBuffer index_staging_;
  Event staged_;
  bool pending_ = false;
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_H_
