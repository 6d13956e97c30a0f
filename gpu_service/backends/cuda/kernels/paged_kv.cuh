// Where a position's row lies in the paged KV cache (attention.cuh's PagedKv layout), for the
// kernels that write or read single rows: the append, the split attention's ring, the fused
// decode kernel. Device-only header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_PAGED_KV_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_PAGED_KV_CUH_

#include <cstdint>

#include "gpu_service/backends/cuda/kernels/attention.cuh"

namespace tandem::cuda {

// The float offset of position pos of sequence seq (its page-table row) in the K and V pools:
// (physical page · 64 + pos % 64) · kvw.
__device__ __forceinline__ int64_t CacheOffset(const PagedKv& c, int32_t seq, int64_t pos, int kvw) {
  const int32_t page = c.page_table[static_cast<int64_t>(seq) * c.max_pages + pos / kKvPageSize];
  return (static_cast<int64_t>(page) * kKvPageSize + pos % kKvPageSize) * kvw;
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_PAGED_KV_CUH_
