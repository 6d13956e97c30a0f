// The order in which routing picks experts, shared by the route kernel (router.cu) and the device
// planner's fused routing (device_plan.cu), so that both pick exactly the same experts: higher
// probability first, ties to the lower expert id (as the CPU reference's partial sort).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_ORDER_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_ORDER_CUH_

#include <cuda_runtime.h>

namespace tandem::cuda {

// Whether (v, id) comes before (bv, bid) in the selection.
__device__ __forceinline__ bool RouteBefore(float v, int id, float bv, int bid) {
  return v > bv || (v == bv && id < bid);
}

// Every lane of the warp ends with the warp's first (v, id) in that order.
__device__ __forceinline__ void WarpRouteFirst(float& v, int& id) {
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xFFFFFFFFu, v, off);
    const int oid = __shfl_xor_sync(0xFFFFFFFFu, id, off);
    if (RouteBefore(ov, oid, v, id)) {
      v = ov;
      id = oid;
    }
  }
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_ORDER_CUH_
