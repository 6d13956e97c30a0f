// Host side of GPU routing: router logits (a dense matrix-vector product of ffn_gate_inp), the
// route kernel, and one device-to-host copy of the picks per MoE layer into pinned memory.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTER_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTER_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

// y (n × m.rows) = m·x for n activation rows x (n × m.cols), all device pointers (the MoE
// family's matvec: any MoeKernelsSupportType type; m.row_bytes is not read). InvalidArgument
// naming `what` for a type, shape or alignment the kernels refuse.
absl::Status DenseMatVec(const char* what, const DeviceMatrix& m, const float* x, int64_t n, float* y,
                         cudaStream_t stream);

// Routes up to max_tokens tokens per call. Not thread-safe; one per stream.
class GpuRouter {
 public:
  static absl::StatusOr<GpuRouter> Create(int64_t max_tokens, int64_t E, int64_t K);

  // Enqueues on `stream`: logits = router·x (router is ffn_gate_inp {h, E}; x is n × h on the
  // device, logits_scratch n × E), routing, and the copy of the picks to pinned host memory.
  // The picks are readable through experts()/weights() once the stream has reached this point
  // (synchronize the stream or an event recorded after the call).
  absl::Status Route(const DeviceMatrix& router, const float* x, int64_t n, float* logits_scratch,
                     cudaStream_t stream);
  // Routing only, from logits already on the device. copy_to_host = false leaves the picks on the
  // device only (experts()/weights() then keep the previous call's values).
  absl::Status RouteLogits(const float* logits, int64_t n, cudaStream_t stream, bool copy_to_host = true);

  // For kernels that route themselves (the device planner's fused routing): the device arrays for
  // n tokens' picks and weights, which experts()/weights()/device_*() then describe.
  absl::StatusOr<std::pair<int32_t*, float*>> DeviceOutputs(int64_t n);
  // Enqueues the copy of the last n tokens' picks and weights to the host arrays.
  absl::Status CopyToHost(cudaStream_t stream);

  // n × K host arrays of the last call (descending weight per token).
  const int32_t* experts() const { return host_.as<int32_t>(); }
  const float* weights() const { return reinterpret_cast<const float*>(host_.as<int32_t>() + last_n_ * K_); }
  // The device copies, for kernels that consume the picks without a host round trip.
  const int32_t* device_experts() const { return device_.as<int32_t>(); }
  const float* device_weights() const { return reinterpret_cast<const float*>(device_.as<int32_t>() + last_n_ * K_); }

 private:
  int64_t max_tokens_ = 0, E_ = 0, K_ = 0;
  int64_t last_n_ = 0;
  // [experts: n·K int32][weights: n·K f32] for the last call's n, so that one copy of n·K·8 bytes
  // brings both to the host.
  DeviceBuffer device_;
  PinnedBuffer host_;
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTER_H_
