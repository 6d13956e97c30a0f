// The GDN gates of one token and value head (device-only header shared by the scalar and vector
// per-token kernels, so that both compute them with the same operations).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_GATES_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_GATES_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"

namespace tandem::cuda {

// GdnGate's operations on values already loaded: b_j, a_j, dt_bias[vh], ssm_a[vh].
__device__ __forceinline__ void GdnGateOf(float b, float a, float dt_bias, float ssm_a, float& g, float& beta) {
  beta = SigmoidF(b);
  const float x = a + dt_bias;
  const float sp = x > 20.0f ? x : log1pf(expf(x));
  g = ssm_a * sp;
}

// Token t's ba entries of value head vh's group (b_j at [j], a_j at [r + j], j = vh % r).
__device__ __forceinline__ const float* GdnBaRow(const float* ba, int64_t ba_stride, int64_t t, int vh, int r) {
  return ba + t * ba_stride + static_cast<int64_t>(vh / r) * 2 * r;
}

// beta = σ(b_j), g = ssm_a[vh]·softplus(a_j + dt_bias[vh]) for token t and value head vh, with
// group = vh / r, j = vh % r (r = nv / nk) and the group's ba entries [b_0..b_{r−1}, a_0..a_{r−1}]
// (ba is n rows of 2nv values, row stride ba_stride; g and beta are n × nv).
__device__ __forceinline__ void GdnGate(const float* ba, int64_t ba_stride, const float* ssm_a, const float* dt_bias,
                                        int64_t t, int vh, int r, int nv, float* g, float* beta) {
  const float* row = GdnBaRow(ba, ba_stride, t, vh, r);
  const int j = vh % r;
  const int64_t i = t * nv + vh;
  GdnGateOf(row[j], row[r + j], dt_bias[vh], ssm_a[vh], g[i], beta[i]);
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_GATES_CUH_
