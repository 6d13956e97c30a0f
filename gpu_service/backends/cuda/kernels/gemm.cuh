// Device half of the prefill GEMM (gemm_plan.h is the host half): dequantization of a range of
// weight rows into a dense f16 or f32 tile, and conversion of f32 activations to f16, so that
// cuBLAS can multiply them.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

// Rows [row_begin, row_begin + count) of w, dequantized into dst (count × w.cols, row-major) as
// f16 bit patterns (round to nearest even) when to_f16, else as f32. With dst_lo (to_f16 only),
// also the residuals f16(v − f16(v)) there: hi + lo keeps about 22 bits of every value.
cudaError_t LaunchDequantizeRows(const DeviceMatrix& w, int64_t row_begin, int64_t count,
                                 bool to_f16, void* dst, cudaStream_t stream, void* dst_lo = nullptr);

// dst[i] = f16(src[i]) for count values (round to nearest even); with dst_lo, also the residuals.
cudaError_t LaunchF32ToF16(const float* src, int64_t count, uint16_t* dst, cudaStream_t stream,
                           uint16_t* dst_lo = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_CUH_
