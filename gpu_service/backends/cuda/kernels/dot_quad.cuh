// s + w · x over four values, fused in the order w, z, y, x: the f32 router product's step, shared
// by the fused MoE kernel's router blocks (moe/fused_router.cuh) and the ffn norm's route blocks
// (norm_route_block.cuh), which form the same logits. Device-only header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DOT_QUAD_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DOT_QUAD_CUH_

#include <cuda_runtime.h>

namespace tandem::cuda {

__device__ __forceinline__ float DotQuad(float4 w, float4 x, float s) {
  return fmaf(w.x, x.x, fmaf(w.y, x.y, fmaf(w.z, x.z, fmaf(w.w, x.w, s))));
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DOT_QUAD_CUH_
