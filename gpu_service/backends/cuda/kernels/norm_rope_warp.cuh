// One head of one token normed and roped by one warp, with the bits of the norm-rope kernels
// (attention_append.cu), for the kernels that prepare a head inside themselves (the one-launch
// decode attention, attention_decode.cu; the fused attention and o, attention_out_fused.cu).
// Device-only; internal linkage.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROPE_WARP_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROPE_WARP_CUH_

#include <cuda_runtime.h>

#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/rope_f64.cuh"

namespace tandem::cuda {
namespace {

// Lane l holds values 32j + l in x[j] and gamma[j]; the sum of squares repeats BlockSum's operations
// as QueryNormRopeWarpKernel does, the rotation rope_f64.cuh's roundings, with the f64 sine and
// cosine of value i < rot from sincos_of(i, j, &s, &c) (j: the register holding value i). The
// partner of a rotated value (i ± rot/2) is read through `row` (hd floats of shared memory, which
// ends holding the result), so that any even rot works, not only multiples of 64. hd: the head dim
// as a run-time value, as those kernels divide by it.
template <int kJ, typename SinCos>
__device__ __forceinline__ void WarpNormRopeRowWith(const float (&x)[kJ], const float (&gamma)[kJ], int hd, float eps,
                                                    int rot, float* row, SinCos&& sincos_of) {
  const int lane = threadIdx.x & 31;
  const float ss = WarpSumSquaresAsBlock<kJ>(x);
  const float r = rsqrtf(ss / static_cast<float>(hd) + eps);
  float y[kJ];
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    y[j] = gamma[j] * (x[j] * r);
    row[32 * j + lane] = y[j];
  }
  __syncwarp();
  const int half = rot / 2;
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    const int i = 32 * j + lane;
    if (i >= rot) continue;
    double s, c;
    sincos_of(i, j, &s, &c);
    y[j] = i < half ? RopeLower(y[j], row[i + half], s, c) : RopeUpper(y[j], row[i - half], s, c);
  }
  __syncwarp();  // every partner has been read
#pragma unroll
  for (int j = 0; j < kJ; ++j) row[32 * j + lane] = y[j];
  __syncwarp();
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROPE_WARP_CUH_
