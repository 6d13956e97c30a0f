// Element-wise kernels of the prefill expert path (expert_prefill.h runs them around cuBLAS):
// dequantizing weights to bf16, gathering activation rows as bf16, and SiLU(gate)·up to bf16.
// bf16 values are passed as their uint16_t bit patterns so that g++ can include this header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// out (rows × cols bf16, row-major) = the matrix w {cols, rows} of ggml type `type`, dequantized
// and rounded to nearest even. cudaErrorInvalidValue for an unsupported type, cols not a multiple
// of the block, or a misaligned w.
cudaError_t LaunchDequantizeToBf16(uint32_t type, const void* w, int cols, int rows, uint16_t* out,
                                   cudaStream_t stream);

// out row i (cols bf16) = x row index[i] (f32), for i < m.
cudaError_t LaunchGatherRowsBf16(const float* x, int cols, const int32_t* index, int m, uint16_t* out,
                                 cudaStream_t stream);

// act (m × inner bf16) = SiLU(gu[:, 0:inner]) ⊙ gu[:, inner:2·inner] for gu m × 2·inner f32.
cudaError_t LaunchSiluMulToBf16(const float* gu, int m, int inner, uint16_t* act, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_CUH_
