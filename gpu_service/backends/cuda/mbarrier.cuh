// Shared-memory mbarrier pieces (sm_90; device-only header) for kernels that pipeline a cp.async
// ring without block-wide barriers: init, a plain arrive, the arrive that fires when this thread's
// earlier cp.async copies have landed, and the phase-parity wait. Addresses are shared-memory
// addresses (__cvta_generic_to_shared) of 8-byte aligned uint64_t slots.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MBARRIER_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MBARRIER_CUH_

#include <cstdint>

namespace tandem::cuda::mbarrier {

// Phase 0 expects `count` arrivals; one thread initializes, and a __syncthreads must follow before
// any other thread uses the barrier. Only while no arrival or wait on it is pending.
__device__ __forceinline__ void Init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// One arrival (release: this thread's earlier memory accesses happen before the phase completes).
__device__ __forceinline__ void Arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// One arrival, made by the hardware once every cp.async this thread issued before it has landed
// (.noinc: it counts against the count given to Init, so every thread that calls this is one of it).
__device__ __forceinline__ void ArriveOnCpAsync(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the phase of parity `parity` (the phase number & 1) has completed (acquire: the
// accesses the arrivals released, cp.async copies included, are visible to this thread after it).
// Phase k is awaited with parity k & 1 while the barrier is in phase k or k + 1.
__device__ __forceinline__ void WaitParity(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

}  // namespace tandem::cuda::mbarrier

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MBARRIER_CUH_
