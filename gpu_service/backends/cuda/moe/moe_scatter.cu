#include "gpu_service/backends/cuda/moe/moe_scatter.cuh"

#include <cstdint>

#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

// The shared term's factor: σ(logit), or 1 without a gate. One expression for both kernels, so
// their sums are bit for bit the same.
__device__ __forceinline__ float SharedGate(const float* shared_gate_logit, int t) {
  return shared_gate_logit != nullptr ? 1.0f / (1.0f + expf(-shared_gate_logit[t])) : 1.0f;
}

// The per-element kernel (any h or pointer the vector kernel does not take; the default before
// h/moeglue): grid (ceil(h / 256), n), one thread per output element. Each iteration's slot load and
// then its partial load depend on each other, and nothing unrolls a runtime K: a thread has one
// gather in flight at a time, so the kernel ran at ~45% of HBM bandwidth at 512 tokens.
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
    const float g = SharedGate(shared_gate_logit, t);
    acc = fmaf(g, shared[static_cast<int64_t>(t) * h + j], acc);
  }
  y[static_cast<int64_t>(t) * h + j] = acc;
}

// The vector kernel: grid (ceil(h / 4 / kVecThreads), n), four columns (one float4) per thread,
// the token's slots and weights read kChunk at a time and then all of the chunk's partial rows
// loaded before the first is summed (kChunk 16-byte loads in flight per thread instead of one).
// The same operations in the same order per element as ScatterSumKernel (fmaf over k ascending
// from 0, then the shared term), so the two are bit-identical.
constexpr int kVecThreads = 128;
constexpr int kChunk = 12;

__device__ __forceinline__ void Fma4(float w, const float4& p, float4& acc) {
  acc.x = fmaf(w, p.x, acc.x);
  acc.y = fmaf(w, p.y, acc.y);
  acc.z = fmaf(w, p.z, acc.z);
  acc.w = fmaf(w, p.w, acc.w);
}

__global__ void __launch_bounds__(kVecThreads) ScatterSumVecKernel(const float* __restrict__ partial,
                                                                   const int32_t* __restrict__ slot,
                                                                   const float* __restrict__ weights, int K, int h,
                                                                   const float* __restrict__ shared,
                                                                   const float* __restrict__ shared_gate_logit,
                                                                   float* __restrict__ y) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int t = blockIdx.y;
  const int h4 = h / 4;
  const int j = blockIdx.x * kVecThreads + threadIdx.x;  // float4 column
  if (j >= h4) return;
  const int32_t* ts = slot + static_cast<int64_t>(t) * K;
  const float* tw = weights + static_cast<int64_t>(t) * K;
  const float4* p4 = reinterpret_cast<const float4*>(partial);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 sh = acc;
  if (shared != nullptr) sh = reinterpret_cast<const float4*>(shared)[static_cast<int64_t>(t) * h4 + j];
  for (int k0 = 0; k0 < K; k0 += kChunk) {
    float4 p[kChunk];
    float w[kChunk];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (k0 + k < K) {
        w[k] = tw[k0 + k];
        p[k] = p4[static_cast<int64_t>(ts[k0 + k]) * h4 + j];
      }
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (k0 + k < K) Fma4(w[k], p[k], acc);
    }
  }
  if (shared != nullptr) Fma4(SharedGate(shared_gate_logit, t), sh, acc);
  reinterpret_cast<float4*>(y)[static_cast<int64_t>(t) * h4 + j] = acc;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t LaunchMoeScatterSumPerElement(const float* partial, const int32_t* slot, const float* weights, int n, int K,
                                          int h, const float* shared, const float* shared_gate_logit, float* y,
                                          cudaStream_t stream) {
  if (n <= 0 || h <= 0) return cudaSuccess;
  if (K < 0) return cudaErrorInvalidValue;
  return LaunchPdl(ScatterSumKernel, dim3((h + kThreads - 1) / kThreads, n), kThreads, 0, stream, partial, slot, weights,
                   K, h, shared, shared_gate_logit, y);
}

cudaError_t LaunchMoeScatterSum(const float* partial, const int32_t* slot, const float* weights, int n, int K, int h,
                                const float* shared, const float* shared_gate_logit, float* y, cudaStream_t stream) {
  if (n <= 0 || h <= 0) return cudaSuccess;
  if (K < 0) return cudaErrorInvalidValue;
  const bool vec = h % 4 == 0 && Aligned16(partial) && Aligned16(y) &&
                   (shared == nullptr || Aligned16(shared));
  if (!vec) {
    return LaunchMoeScatterSumPerElement(partial, slot, weights, n, K, h, shared, shared_gate_logit, y, stream);
  }
  const int h4 = h / 4;
  return LaunchPdl(ScatterSumVecKernel, dim3((h4 + kVecThreads - 1) / kVecThreads, n), kVecThreads, 0, stream, partial,
                   slot, weights, K, h, shared, shared_gate_logit, y);
}

}  // namespace tandem::cuda
