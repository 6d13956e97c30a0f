// The bulk-copy matrix-vector product for batch-1 decode: y = W·x for one f32 activation row, W a
// Q8_0x8 matrix (device_matrix.h) of contiguous rows, f32 products and f32 accumulation. Each block
// owns a contiguous run of rows and streams it through a ring of shared-memory stages filled by the
// tensor memory accelerator (cp.async.bulk completing an mbarrier): one thread keeps ~140 KB an SM
// in flight from the block's first cycle, before its PDL wait (the weights are constants), where
// the streaming kernel (matvec_stream.cuh) keeps at most 12 16-byte loads a lane and measured
// 1.7-1.8 TB/s on a cold L2 for the decode step's input products (Nsight Compute, H200, the
// twenty-fourth session: the stacked GDN inputs 27 MB in 14.9 us, attention's q 17.8 MB in 10.6).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_MATVEC_BULK_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_MATVEC_BULK_CUH_

#include <cuda_runtime.h>

#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

// Whether the bulk kernel takes the product: one activation row, Q8_0x8 at its natural row stride
// (rows contiguous, so that a block's rows are one run of bytes), 16-byte aligned data, columns a
// multiple of 512 up to 2048 (each lane holds its columns of x in registers).
bool BulkMatVecTakes(const DeviceMatrix& w, int n);

// y[0 .. w.rows) = W·x (x: w.cols floats, 16-byte aligned). cudaErrorInvalidValue where
// BulkMatVecTakes is false. Launched with PDL (pdl.cuh): the weights' copies go out before the wait.
cudaError_t LaunchBulkMatVec(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream);

// TANDEM_MATVEC_BULK (read once; default off until measured end to end): LaunchDenseMatVec's
// kAuto route takes the bulk kernel wherever it takes the product. Set* for tests and benchmarks.
bool MatVecBulk();
void SetMatVecBulk(bool on);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_MATVEC_BULK_CUH_
