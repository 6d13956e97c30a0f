#include "gpu_service/backends/cuda/moe/router.h"

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/moe/matvec.cuh"
#include "gpu_service/backends/cuda/moe/router.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {

absl::Status DenseMatVec(const char* what, const DeviceMatrix& m, const float* x, int64_t n, float* y,
                         cudaStream_t stream) {
  const uint32_t type = m.type;
  if (!MoeKernelsSupportType(type)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": weight type ", type, " has no GPU matrix-vector kernel"));
  }
  if (reinterpret_cast<uintptr_t>(m.data) % KernelRowAlignment(type) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": device address not ", KernelRowAlignment(type),
                                                   "-byte aligned"));
  }
  const cudaError_t err = LaunchDenseMatVec(type, m.data, static_cast<int>(m.cols), static_cast<int>(m.rows), x,
                                            static_cast<int>(n), y, stream);
  if (err == cudaErrorInvalidValue) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape {", m.cols, ", ", m.rows,
                                                   "} with ", n, " rows is refused by the matrix-vector kernel"));
  }
  return CudaStatus(err, what, __FILE__, __LINE__);
}

absl::StatusOr<GpuRouter> GpuRouter::Create(int64_t max_tokens, int64_t E, int64_t K) {
  if (max_tokens < 1 || K < 1 || K > E || K > 64 || E > kMaxRouterExperts) {
    return absl::InvalidArgumentError(absl::StrCat("GpuRouter: max_tokens=", max_tokens, " E=", E, " K=", K,
                                                   " (need 1 <= K <= min(E, 64), E <= ", kMaxRouterExperts, ")"));
  }
  GpuRouter r;
  r.max_tokens_ = max_tokens;
  r.E_ = E;
  r.K_ = K;
  const size_t bytes = static_cast<size_t>(max_tokens * K) * (sizeof(int32_t) + sizeof(float));
  absl::StatusOr<DeviceBuffer> d = DeviceBuffer::Allocate(bytes);
  if (!d.ok()) return d.status();
  r.device_ = *std::move(d);
  absl::StatusOr<PinnedBuffer> h = PinnedBuffer::Allocate(bytes);
  if (!h.ok()) return h.status();
  r.host_ = *std::move(h);
  return r;
}

absl::Status GpuRouter::Route(const DeviceMatrix& router, const float* x, int64_t n, float* logits_scratch,
                              cudaStream_t stream) {
  if (router.rows != E_) {
    return absl::InvalidArgumentError(absl::StrCat("ffn_gate_inp has ", router.rows, " rows, expected E=", E_));
  }
  if (absl::Status s = DenseMatVec("ffn_gate_inp", router, x, n, logits_scratch, stream); !s.ok()) return s;
  return RouteLogits(logits_scratch, n, stream);
}

absl::Status GpuRouter::RouteLogits(const float* logits, int64_t n, cudaStream_t stream, bool copy_to_host) {
  if (n < 0 || n > max_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("GpuRouter: ", n, " tokens, capacity ", max_tokens_));
  }
  last_n_ = n;
  int32_t* dev_experts = device_.as<int32_t>();
  float* dev_weights = reinterpret_cast<float*>(dev_experts + n * K_);
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchRouteTopK(logits, static_cast<int>(n), static_cast<int>(E_),
                                              static_cast<int>(K_), dev_experts, dev_weights, stream));
  if (!copy_to_host) return absl::OkStatus();
  return CopyToHost(stream);
}

absl::StatusOr<std::pair<int32_t*, float*>> GpuRouter::DeviceOutputs(int64_t n) {
  if (n < 0 || n > max_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("GpuRouter: ", n, " tokens, capacity ", max_tokens_));
  }
  last_n_ = n;
  int32_t* dev_experts = device_.as<int32_t>();
  return std::make_pair(dev_experts, reinterpret_cast<float*>(dev_experts + n * K_));
}

absl::Status GpuRouter::CopyToHost(cudaStream_t stream) {
  // One copy for both arrays.
  const size_t bytes = static_cast<size_t>(last_n_ * K_) * (sizeof(int32_t) + sizeof(float));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_.get(), device_.get(), bytes, cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

}  // namespace tandem::cuda
