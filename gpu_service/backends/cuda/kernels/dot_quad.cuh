// The f32 router product's steps, shared by the fused MoE kernel's router blocks
// (moe/fused_router.cuh) and the ffn norm's route blocks (norm_route_block.cuh), which form the same
// logits. Device-only header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DOT_QUAD_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DOT_QUAD_CUH_

#include <cuda_runtime.h>

namespace tandem::cuda {

// s + w · x over four values, fused in the order w, z, y, x.
__device__ __forceinline__ float DotQuad(float4 w, float4 x, float s) {
  return fmaf(w.x, x.x, fmaf(w.y, x.y, fmaf(w.z, x.z, fmaf(w.w, x.w, s))));
}

// s + Σ_k w[k] · x[first + 32k] over the k whose index is below n (a lane's strided part of a row's
// dot product: lane l of a warp passes first = l), in k's order.
template <int kN, typename Index>
__device__ __forceinline__ float DotLanes(const float4 (&w)[kN], const float4* x, Index first, Index n, float s) {
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    const Index i = first + 32 * k;
    if (i < n) {
      const float4 v = x[i];
      s = DotQuad(w[k], v, s);
    }
  }
  return s;
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DOT_QUAD_CUH_
