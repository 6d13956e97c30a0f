// cp.async pieces shared by the kernels that stage global memory into shared memory
// asynchronously (sm_80+; device-only header): the plain 16-byte copy and the group fences. Copies
// with other widths, cache hints or zero-fill stay with their kernels.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_CP_ASYNC_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_CP_ASYNC_CUH_

#include <cstdint>

namespace tandem::cuda {

// 16 bytes global -> shared (shared-memory address smem_addr) without registers, cached in L2 only.
__device__ __forceinline__ void CpAsync16(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem) : "memory");
}

// Closes the group of this thread's cp.async copies issued since the last commit.
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's committed groups are still in flight. The "memory"
// clobbers keep the compiler from moving shared-memory reads above the wait.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_CP_ASYNC_CUH_
