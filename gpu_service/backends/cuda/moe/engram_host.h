// One Engram layer on the GPU: the host gathers the positions' table rows (their addresses depend
// only on token ids, so this can run ahead of the GPU), uploads them with one copy, and the GPU
// runs the key/value projections, the per-stream gates, the dilated conv with its state and the
// injection into the streams (docs/MODEL.md §4.3, EngramForward of common/reference/engram.h).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ENGRAM_HOST_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ENGRAM_HOST_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "common/reference/engram.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/moe/router.h"

namespace tandem::cuda {

// Device copies of one Engram layer's tensors (engram_embd stays on the host).
struct EngramDeviceWeights {
  DeviceMatrix key;          // engram_key {pin, S·h}
  DeviceMatrix value;        // engram_value {pin, h}
  const float* key_norm;     // S·h
  const float* query_norm;   // S·h
  const float* conv_norm;    // S·h
  const float* conv;         // engram_conv {ck, S·h}: channel c's taps at c·ck
};

class GpuEngramLayer {
 public:
  // Scratch for up to max_n positions per call.
  static absl::StatusOr<GpuEngramLayer> Create(const EngramConfig& config, int64_t S, int64_t h, int64_t max_n);

  // Host side: dequantizes the n positions' table rows (rows: n × rows_per_token, from EngramRows)
  // from engram_embd (host view) into pinned memory and enqueues their upload on `stream`.
  absl::Status Stage(const MatrixView& embd, std::span<const int64_t> rows, int64_t n, cudaStream_t stream);

  // Device side for the n staged positions: H (n × S·h, device) updated in place; conv_state
  // (device, conv_history() × S·h, oldest row first, zeros at sequence start) advanced.
  absl::Status Forward(const EngramDeviceWeights& w, float* H, int64_t n, float eps, float* conv_state,
                       cudaStream_t stream);

 private:
  EngramConfig config_;
  int64_t S_ = 0, h_ = 0, max_n_ = 0, staged_n_ = 0;
  PinnedBuffer e_staging_;
  DeviceBuffer e_;       // n × pin
  DeviceBuffer kv_;      // n × S·h
  DeviceBuffer v_;       // n × h
  DeviceBuffer u_;       // n × S·h
  DeviceBuffer window_;  // (hist + n) × S·h
  Event staged_;
  bool pending_ = false;
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ENGRAM_HOST_H_
