#include "gpu_service/backends/cuda/kernels/l2_prefetch.cuh"

#include <atomic>

#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

// Each range is cut into kChunk pieces spread over the grid's threads, so that many SMs' copy
// engines carry the requests (one thread issuing megabytes would be served by one SM's unit).
constexpr uint64_t kChunk = 16 * 1024;
constexpr int kThreads = 128;
constexpr int kBlocks = 32;

// stride: bytes from one request to the next; each asks for min(each, what is left) bytes.
__global__ void __launch_bounds__(kThreads) L2PrefetchKernel(L2PrefetchList list, uint64_t stride, uint64_t each) {
  const uint64_t worker = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const uint64_t workers = static_cast<uint64_t>(gridDim.x) * kThreads;
  for (int r = 0; r < list.count; ++r) {
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(list.data[r]) + 15) & ~uintptr_t{15};
    const uintptr_t end = (reinterpret_cast<uintptr_t>(list.data[r]) + list.bytes[r]) & ~uintptr_t{15};
    if (end <= begin) continue;
    const uint64_t chunks = (end - begin + stride - 1) / stride;
    for (uint64_t c = worker; c < chunks; c += workers) {
      const uintptr_t p = begin + c * stride;
      const uint64_t n = end - p < each ? end - p : each;
      PrefetchL2(reinterpret_cast<const void*>(p), static_cast<unsigned>(n));
    }
  }
}

}  // namespace

cudaError_t LaunchL2Prefetch(const L2PrefetchList& list, cudaStream_t stream, bool touch_only) {
  if (list.count < 0 || list.count > kMaxL2PrefetchRanges) return cudaErrorInvalidValue;
  if (list.count == 0) return cudaSuccess;
  const uint64_t stride = touch_only ? kL2TouchStride : kChunk, each = touch_only ? 128 : kChunk;
  L2PrefetchKernel<<<kBlocks, kThreads, 0, stream>>>(list, stride, each);
  return cudaGetLastError();
}

namespace {
std::atomic<bool>& L2TouchSwitch() {
  static std::atomic<bool> on{EnvSwitch("TANDEM_L2_TOUCH")};
  return on;
}
}  // namespace

bool L2TouchOnly() { return L2TouchSwitch().load(std::memory_order_relaxed); }
void SetL2TouchOnly(bool on) { L2TouchSwitch().store(on, std::memory_order_relaxed); }

}  // namespace tandem::cuda
