// A load with acquire semantics at device scope, for spin waits on counters or flags that other
// blocks of running grids publish with a release (a fence then an atomic): what they wrote before
// is visible after the load that sees their value. libcu++'s atomic_ref (ld.acquire.gpu on sm_70
// and later). Device code only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_LOAD_ACQUIRE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_LOAD_ACQUIRE_CUH_

#include <cuda/atomic>

namespace tandem::cuda {

template <typename T>
__device__ __forceinline__ T LoadAcquire(const T* p) {
  return ::cuda::atomic_ref<T, ::cuda::thread_scope_device>(*const_cast<T*>(p)).load(::cuda::memory_order_acquire);
}

// A relaxed load at device scope (ld.relaxed.gpu): polls a value another running grid stores with a
// relaxed store, never from this SM's L1 and never hoisted out of the polling loop.
template <typename T>
__device__ __forceinline__ T LoadRelaxed(const T* p) {
  return ::cuda::atomic_ref<T, ::cuda::thread_scope_device>(*const_cast<T*>(p)).load(::cuda::memory_order_relaxed);
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_LOAD_ACQUIRE_CUH_
