// Host side of the decode expert path: planning one MoE step into ExpertUnits (who computes which
// (expert, token) pair and into which partial row), and running the units on the GPU with the
// dequantize-on-the-fly kernels of matvec.cuh (f32 activations: the exact mode).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERTS_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERTS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/moe/expert_unit.h"

namespace tandem::cuda {

// A routed pair the GPU kernels do not compute (its expert is not on the GPU): the caller computes
// FFN_expert(x[token]) elsewhere (the host worker) and copies it into partial row `slot`.
struct OffloadedPair {
  int32_t expert;
  int32_t token;
  int32_t slot;
};

struct MoeStepPlan {
  std::vector<ExpertUnit> units;  // GPU work; each expert's rows in units of at most kMaxUnitRows
  int max_unit_rows = 0;          // largest units[i].rows (0 without units)
  std::vector<int32_t> slot;      // n × K: the partial row of pair (t, k)
  std::vector<OffloadedPair> offloaded;
  int32_t gpu_slots = 0;          // slots [0, gpu_slots) are written by the units
  int32_t total_slots = 0;        // offloaded pairs use [gpu_slots, total_slots)
};

// Plans one step from the routing picks (n × K expert ids). locate(e) gives expert e's device
// location, or nullopt when e is computed elsewhere. Pairs are grouped by expert, experts ascending
// and tokens ascending within one (the order ReferenceExpertExecutor receives), GPU pairs first.
// InvalidArgument for an expert id outside [0, E).
absl::StatusOr<MoeStepPlan> PlanMoeStep(std::span<const int32_t> experts, int64_t n, int64_t K, int64_t E,
                                        absl::FunctionRef<std::optional<ExpertLocation>(int32_t)> locate);

// Units applying one expert (the shared expert, say) to tokens 0..n−1, token t into slot first_slot + t.
std::vector<ExpertUnit> DenseExpertUnits(const ExpertLocation& where, int64_t n, int32_t first_slot);

// Runs lists of units: stages them through pinned memory with one copy per call, then launches
// the fused gate/up kernel and the down kernel. Not thread-safe; one per stream.
class ExpertDecodeRunner {
 public:
  static absl::StatusOr<ExpertDecodeRunner> Create(int64_t max_units);

  struct Shape {
    WeightType gate_up_type;  // gate and up share one type
    WeightType down_type;
    int64_t h;
    int64_t inner;            // I
  };
  // x: MoE input rows (device, rows addressed by units' input_row, h wide); act: scratch of at
  // least max slot × inner floats; partial: rows of h floats written at the units' slots.
  // InvalidArgument for a unit with a null matrix, rows outside [1, kMaxUnitRows], a misaligned
  // matrix, or a type/shape the kernels refuse.
  absl::Status Run(std::span<const ExpertUnit> units, const Shape& shape, const float* x, float* act, float* partial,
                   cudaStream_t stream);
  // The same for units already in device memory (planned on the GPU, device_plan.cuh): the grid
  // covers max_units units and the kernels skip those at index >= *device_count. max_rows bounds
  // every unit's rows (1 selects the one-row kernels). Nothing is read on the host, so the call
  // can be captured in a CUDA graph.
  absl::Status RunPlanned(const ExpertUnit* device_units, int max_units, const int* device_count, int max_rows,
                          const Shape& shape, const float* x, float* act, float* partial, cudaStream_t stream);

 private:
  absl::Status LaunchUnits(const ExpertUnit* device_units, int count, const int* device_count, int max_rows,
                           const Shape& shape, const float* x, float* act, float* partial, cudaStream_t stream);
  int64_t max_units_ = 0;
  PinnedBuffer staging_;
  DeviceBuffer device_units_;
  Event staged_;  // the last upload has left staging_
  bool pending_ = false;
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERTS_H_
