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
__device__ __forceinline__ void ClusterWait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_CLUSTER_BARRIER_CUH_
