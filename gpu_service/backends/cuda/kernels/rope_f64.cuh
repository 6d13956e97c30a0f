// The f64 rotation of one NeoX RoPE pair (value y, its partner i ± rot/2, the angle's sin s and cos
// c) with the roundings every kernel of the attention prep must share: nvcc 13 compiled the block
// kernels' source (QueryNormRopeKernel, sm_90a SASS) as DFMA(y, c, −DMUL(partner, s)) for the lower
// half and fma.rn(c, y, rn(s · partner)) for the upper one, and contracted the same source the other
// way in another kernel, so the kernels spell these out rather than leave the contraction to the
// compiler. GpuGlueKernelsTest, GpuAttentionDecodeTest and GpuAttentionFusedTest compare the bits.
// Device-only; included by the prep kernels' files (attention_append.cu, attention_decode.cu).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ROPE_F64_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ROPE_F64_CUH_

#include <cuda_runtime.h>

namespace tandem::cuda {
namespace {

// i < rot / 2: y·c − partner·s.
__device__ __forceinline__ float RopeLower(float y, float partner, double s, double c) {
  return static_cast<float>(__fma_rn(static_cast<double>(y), c, -__dmul_rn(static_cast<double>(partner), s)));
}
// rot / 2 <= i < rot: partner·s + y·c.
__device__ __forceinline__ float RopeUpper(float y, float partner, double s, double c) {
  return static_cast<float>(__fma_rn(c, static_cast<double>(y), __dmul_rn(s, static_cast<double>(partner))));
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ROPE_F64_CUH_
