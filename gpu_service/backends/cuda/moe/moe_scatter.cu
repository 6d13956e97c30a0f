#include "gpu_service/backends/cuda/moe/moe_scatter.cuh"

#include "gpu_service/backends/cuda/pdl.cuh"
namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

// grid (ceil(h / 256), n): one thread per output element; the K slots and weights of the token
// are read through the cache by every thread of the row.
__global__ void __launch_bounds__(kThreads) ScatterSumKernel(const float* partial, const int32_t* slot,
                                                             const float* weights, int K, int h, const float* shared,
                                                             const float* shared_gate_logit, float* y) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int t = blockIdx.y;
  const int j = blockIdx.x * kThreads + threadIdx.x;
  if (j >= h) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) {
    const int64_t s = slot[static_cast<int64_t>(t) * K + k];
    acc = fmaf(weights[static_cast<int64_t>(t) * K + k], partial[s * h + j], acc);
  }
  if (shared != nullptr) {
    float g = 1.0f;
    if (shared_gate_logit != nullptr) g = 1.0f / (1.0f + expf(-shared_gate_logit[t]));
    acc = fmaf(g, shared[static_cast<int64_t>(t) * h + j], acc);
  }
  y[static_cast<int64_t>(t) * h + j] = acc;
}

}  // namespace

cudaError_t LaunchMoeScatterSum(const float* partial, const int32_t* slot, const float* weights, int n, int K, int h,
                                const float* shared, const float* shared_gate_logit, float* y, cudaStream_t stream) {
  if (n <= 0 || h <= 0) return cudaSuccess;
  if (K < 0) return cudaErrorInvalidValue;
  return LaunchPdl(ScatterSumKernel, dim3((h + kThreads - 1) / kThreads, n), kThreads, 0, stream, partial, slot, weights, K, h,
                                                                                     shared, shared_gate_logit, y);
}

}  // namespace tandem::cuda
