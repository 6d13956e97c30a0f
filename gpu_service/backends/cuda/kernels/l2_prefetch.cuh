// Weights brought into L2 ahead of the kernels that read them. A small decode step is a chain of
// latency-bound kernels during which HBM is mostly idle (a batch-1 step reads ~3.3 GB in ~4 ms,
// under a fifth of what HBM could deliver): a prefetch issued on a side stream a few kernels ahead
// lets the later matrix-vector products read from L2 instead of waiting on HBM. The kernel only
// issues bulk L2 prefetches (cp.async.bulk.prefetch.L2, fire and forget) and returns.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_L2_PREFETCH_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_L2_PREFETCH_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

inline constexpr int kMaxL2PrefetchRanges = 12;

struct L2PrefetchList {
  const void* data[kMaxL2PrefetchRanges] = {};
  uint64_t bytes[kMaxL2PrefetchRanges] = {};
  int count = 0;
  // Adds [p, p + n) when p is not null and there is room; returns false when the list is full.
  bool Add(const void* p, uint64_t n) {
    if (p == nullptr || n == 0) return true;
    if (count == kMaxL2PrefetchRanges) return false;
    data[count] = p;
    bytes[count] = n;
    ++count;
    return true;
  }
};

// Asks L2 for every range of `list` (each from its first 16-byte boundary, the tail below 16 bytes
// left out) on `stream`. cudaErrorInvalidValue for a count outside [0, kMaxL2PrefetchRanges].
// The ranges must stay valid until the prefetches have been served (weights: always).
cudaError_t LaunchL2Prefetch(const L2PrefetchList& list, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_L2_PREFETCH_CUH_
