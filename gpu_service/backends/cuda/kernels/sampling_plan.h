// Host half of GPU sampling (sampling.cuh is the device half): owns the scratch of the sort for
// up to max_rows rows of a vocabulary, taken once at Create so that steps allocate nothing.
// Not thread-safe: one GpuSampler per stream.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_SAMPLING_PLAN_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_SAMPLING_PLAN_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/kernels/sampling.cuh"

namespace tandem::cuda {

class GpuSampler {
 public:
  static absl::StatusOr<std::unique_ptr<GpuSampler>> Create(int max_rows, int vocab);

  // tokens[r] = argmax of logits row r (ties: the lower id); rows <= max_rows.
  absl::Status Greedy(const float* logits, int rows, int32_t* tokens, cudaStream_t stream);
  // tokens[r] sampled with params[r] (a device array); rows <= max_rows.
  absl::Status Sample(const float* logits, int rows, const SamplingRowParams* params, int32_t* tokens,
                      cudaStream_t stream);

 private:
  GpuSampler(int max_rows, int vocab) : max_rows_(max_rows), vocab_(vocab) {}
  absl::Status CheckRows(int rows) const;
  int max_rows_, vocab_;
  DeviceBuffer temp_, sorted_logits_, ids_, sorted_ids_, offsets_;
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_SAMPLING_PLAN_H_
