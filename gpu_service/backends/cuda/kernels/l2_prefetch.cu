#include "gpu_service/backends/cuda/kernels/l2_prefetch.cuh"

#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

// Each range is cut into kChunk pieces spread over the grid's threads, so that many SMs' copy
// engines carry the requests (one thread issuing megabytes would be served by one SM's unit).
constexpr uint64_t kChunk = 16 * 1024;
constexpr int kThreads = 128;
constexpr int kBlocks = 32;

__global__ void __launch_bounds__(kThreads) L2PrefetchKernel(L2PrefetchList list) {
  const uint64_t worker = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const uint64_t workers = static_cast<uint64_t>(gridDim.x) * kThreads;
  for (int r = 0; r < list.count; ++r) {
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(list.data[r]) + 15) & ~uintptr_t{15};
    const uintptr_t end = (reinterpret_cast<uintptr_t>(list.data[r]) + list.bytes[r]) & ~uintptr_t{15};
    if (end <= begin) continue;
    const uint64_t chunks = (end - begin + kChunk - 1) / kChunk;
    for (uint64_t c = worker; c < chunks; c += workers) {
      const uintptr_t p = begin + c * kChunk;
      const uint64_t n = end - p < kChunk ? end - p : kChunk;
      PrefetchL2(reinterpret_cast<const void*>(p), static_cast<unsigned>(n));
    }
  }
}

}  // namespace

cudaError_t LaunchL2Prefetch(const L2PrefetchList& list, cudaStream_t stream) {
  if (list.count < 0 || list.count > kMaxL2PrefetchRanges) return cudaErrorInvalidValue;
  if (list.count == 0) return cudaSuccess;
  L2PrefetchKernel<<<kBlocks, kThreads, 0, stream>>>(list);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
