// The route kernel: one block of 256 threads per token.
#include "gpu_service/backends/cuda/moe/router.cuh"

#include <cfloat>

#include "gpu_service/backends/cuda/moe/route_order.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;


__device__ double BlockSumDouble(double v, double* scratch) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];  // same order in every thread
  return total;
}

__global__ void __launch_bounds__(kThreads) RouteKernel(const float* logits, int E, int K, int32_t* experts,
                                                        float* weights) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  extern __shared__ float probs[];
  __shared__ double dscratch[kWarps];
  __shared__ float best_v[kWarps];
  __shared__ int best_id[kWarps];
  __shared__ int picked[64];
  const int t = blockIdx.x;
  const float* row = logits + static_cast<int64_t>(t) * E;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float mx = -FLT_MAX;
  for (int i = threadIdx.x; i < E; i += kThreads) {
    probs[i] = row[i];
    mx = fmaxf(mx, probs[i]);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
  if (lane == 0) best_v[warp] = mx;
  __syncthreads();
  mx = best_v[0];
  for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, best_v[w]);

  double local = 0.0;
  for (int i = threadIdx.x; i < E; i += kThreads) {
    const float e = static_cast<float>(exp(static_cast<double>(probs[i] - mx)));
    probs[i] = e;
    local += e;
  }
  const double sum = BlockSumDouble(local, dscratch);
  const float inv = static_cast<float>(1.0 / sum);
  for (int i = threadIdx.x; i < E; i += kThreads) probs[i] *= inv;
  __syncthreads();

  // K rounds of block-wide argmax; a picked expert's π is set below every probability.
  for (int k = 0; k < K; ++k) {
    float bv = -FLT_MAX;
    int bid = E;
    for (int i = threadIdx.x; i < E; i += kThreads) {
      if (RouteBefore(probs[i], i, bv, bid)) {
        bv = probs[i];
        bid = i;
      }
    }
    WarpRouteFirst(bv, bid);
    if (lane == 0) {
      best_v[warp] = bv;
      best_id[warp] = bid;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float v = best_v[0];
      int id = best_id[0];
      for (int w = 1; w < kWarps; ++w) {
        if (RouteBefore(best_v[w], best_id[w], v, id)) {
          v = best_v[w];
          id = best_id[w];
        }
      }
      picked[k] = id;
      weights[static_cast<int64_t>(t) * K + k] = v;  // π for now; renormalised below
      probs[id] = -FLT_MAX;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int k = 0; k < K; ++k) s += weights[static_cast<int64_t>(t) * K + k];
    for (int k = 0; k < K; ++k) {
      const int64_t o = static_cast<int64_t>(t) * K + k;
      experts[o] = picked[k];
      weights[o] = static_cast<float>(weights[o] / s);
    }
  }
}

}  // namespace

cudaError_t LaunchRouteTopK(const float* logits, int n, int E, int K, int32_t* experts, float* weights,
                            cudaStream_t stream) {
  if (K < 1 || K > E || K > 64 || E > kMaxRouterExperts) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(E) * sizeof(float);
  if (smem > 48 * 1024) {
    if (cudaError_t e = cudaFuncSetAttribute(RouteKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem));
        e != cudaSuccess) {
      return e;
    }
  }
  return LaunchPdl(RouteKernel, n, kThreads, smem, stream, logits, E, K, experts, weights);
}

}  // namespace tandem::cuda
