// Raising a kernel's dynamic shared-memory limit only when a launch needs more than it was given.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_SMEM_LIMIT_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_SMEM_LIMIT_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>

namespace tandem::cuda {

// Raises `kernel`'s dynamic shared-memory limit to `bytes` when that is more than `raised` (the
// largest size set so far for this kernel, kept by the caller: one static per kernel
// instantiation, starting at the default 48 KiB). The limit only grows, so each larger size costs
// one cudaFuncSetAttribute and later launches none. Not a stream operation: allowed while a
// stream is being captured into a graph.
template <typename Kernel>
cudaError_t RaiseDynamicSmemLimit(Kernel kernel, size_t bytes, std::atomic<size_t>& raised) {
  if (bytes <= raised.load(std::memory_order_relaxed)) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err == cudaSuccess) raised.store(bytes, std::memory_order_relaxed);
  return err;
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_SMEM_LIMIT_H_
