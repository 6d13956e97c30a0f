// Block-wide reductions shared by the kernels (device-only header).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_BLOCK_REDUCE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_BLOCK_REDUCE_CUH_

#include <cuda_runtime.h>

namespace tandem::cuda {

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

template <typename T>
__device__ __forceinline__ T WarpMax(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// `scratch` holds 32 values in shared memory; the call contains __syncthreads().
template <typename T>
__device__ __forceinline__ T BlockSum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = lane < warps ? scratch[lane] : T(0);
  return WarpSum(total);
}

// BlockSum of x² over a block of 32·kJ threads, formed by one warp whose lane l holds thread
// 32j + l's value in x[j]: per j warp j's butterfly (WarpSum, the same per-lane expressions),
// lane 0's value taken by lane j, then WarpSum, as BlockSum adds its scratch. Every lane gets it.
// For kernels that keep a block kernel's bits with a warp a row (the query and key norms).
template <int kJ>
__device__ __forceinline__ float WarpSumSquaresAsBlock(const float (&x)[kJ]) {
  const int lane = threadIdx.x & 31;
  float total = 0.0f;
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    const float warp_j = __shfl_sync(0xFFFFFFFFu, WarpSum(x[j] * x[j]), 0);
    if (lane == j) total = warp_j;
  }
  return WarpSum(total);
}

template <typename T>
__device__ __forceinline__ T BlockMax(T v, T* scratch, T lowest) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T m = lane < warps ? scratch[lane] : lowest;
  return WarpMax(m);
}

__device__ __forceinline__ float SigmoidF(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float SiluF(float x) { return x * SigmoidF(x); }

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_BLOCK_REDUCE_CUH_
