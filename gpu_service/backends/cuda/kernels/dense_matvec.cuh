// Dense matrix-vector products for decode: y = W·x for 1..8 activation rows, with W in any type
// of DenseKernelsSupportType, dequantized on the fly, f32 activations and f32 accumulation
// (the exact mode of docs/MODEL.md §5). Decode is memory-bound: each weight byte is read once per
// launch whatever the number of activation rows.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

inline constexpr int kMatVecMaxRows = 8;

// x: n rows of w.cols f32 (row t at x + t·x_stride); y: n rows of w.rows f32 (row t at
// y + t·y_stride). 1 <= n <= kMatVecMaxRows. x must be 16-byte aligned with x_stride a multiple of 4.
// y must not alias x. cudaErrorInvalidValue for an unsupported type or shape.
cudaError_t LaunchDenseMatVec(const DeviceMatrix& w, const float* x, int64_t x_stride, int n,
                              float* y, int64_t y_stride, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_CUH_
