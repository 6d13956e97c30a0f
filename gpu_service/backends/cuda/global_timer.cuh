// The GPU's global nanosecond timer (%globaltimer; 256 ns steps on the H200), the same on every SM:
// for timeouts of spin waits and for phase stamps compared across blocks; and the SM a block runs
// on (%smid), which the probes record beside their stamps. Device code only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_GLOBAL_TIMER_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_GLOBAL_TIMER_CUH_

namespace tandem::cuda {

__device__ __forceinline__ unsigned long long GlobalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned SmId() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_GLOBAL_TIMER_CUH_
