// The order in which routing picks experts, shared by the route kernel (router.cu), the device
// planner's fused routing (device_plan.cu) and the route-and-plan kernel (route_plan.cu), so that
// all pick exactly the same experts: higher probability first, ties to the lower expert id (as the
// CPU reference's partial sort).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_ORDER_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_ORDER_CUH_

#include <cuda_runtime.h>

#include <cfloat>

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

// One selection round over a warp whose lane l holds the values of experts l, l + 32, ... in p
// (kPer each, E experts in all): every lane ends with the warp's first (v, id), and the lane that
// owns it drops it from p (-FLT_MAX) for the later rounds.
template <int kPer>
__device__ __forceinline__ void WarpTakeFirst(float (&p)[kPer], int lane, int E, float& v, int& id) {
  v = -FLT_MAX;
  id = E;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (RouteBefore(p[j], lane + 32 * j, v, id)) {
      v = p[j];
      id = lane + 32 * j;
    }
  }
  WarpRouteFirst(v, id);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (lane + 32 * j == id) p[j] = -FLT_MAX;
  }
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_ORDER_CUH_
