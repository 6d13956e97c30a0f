// The cp.async group fences shared by the kernels that stage global memory into shared memory
// asynchronously (sm_80+; device-only header). The copies themselves stay with their kernels:
// they differ in width, cache hint and zero-fill.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_CP_ASYNC_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_CP_ASYNC_CUH_

namespace tandem::cuda {

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
