// Embedding gather: H_s = token_embd[token] for every stream s (docs/MODEL.md §4.1), dequantized
// on the GPU from the stored block format to f32.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_EMBEDDING_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_EMBEDDING_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

// For each of the n tokens (device array), writes its row of `table` ({h, V}: table.cols = h) as
// f32 into H[(t·S + s)·h ...] for s < S. A token id outside [0, table.rows) is a caller bug: its
// rows are filled with NaN so that the error shows downstream instead of reading stray memory. cudaErrorInvalidValue for an unsupported type or h not a multiple of 32.
cudaError_t LaunchEmbeddingGather(const DeviceMatrix& table, const int32_t* tokens, int64_t n,
                                  int64_t S, float* H, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_EMBEDDING_CUH_
