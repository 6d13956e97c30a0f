// The two halves of a thread-block cluster's barrier (PTX barrier.cluster, sm_90): arrive with
// release, wait with acquire, so that shared-memory writes before a block's arrive are visible to
// every block of the cluster after its wait. Every thread of every block of the cluster calls both
// (.aligned: a warp's threads call them together). The fused one-token MoE kernel and the fused GDN
// decode kernel split the barrier so that work that needs no other block runs between the halves.
// Device code only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_CLUSTER_BARRIER_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_CLUSTER_BARRIER_CUH_

namespace tandem::cuda {

__device__ __forceinline__ void ClusterArrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
// Arrive without release: for a block that publishes nothing with this arrive (it only says that
// it is done reading the others' shared memory: values it has already used, or stored, so the
// loads are complete) or that made its data visible otherwise (st.async into the reader's barrier,
// mbarrier.cuh). barrier.cluster.arrive.release compiles to MEMBAR.ALL.GPU before the arrive,
// which waits for the block's outstanding memory operations, cp.async copies included: relaxing
// the fused MoE kernel's second arrive alone made batch-1 decode 2.0% faster on the H200
// (docs/PERF.md, forty-eighth session).
__device__ __forceinline__ void ClusterArriveRelaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void ClusterWait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_CLUSTER_BARRIER_CUH_
