// Routing and the MoE step's plan in one launch (route_plan.cu), for the MoE stage: from the router
// logits, each token's K experts and weights exactly as the route kernel (router.cuh) picks them,
// then the work list the device planner (device_plan.cuh) makes.
//
// Why one kernel: each token is routed by a warp with a candidate-based top-K (a few shuffles
// instead of K rounds of argmax), many tokens at once, and the block that finishes last (an atomic
// counter) plans the step; the one-warp plan kernel routed every token in one warp. The stage uses
// it for steps of 2 to kDevicePlanMaxTokens tokens and for prefill steps planned on the device.
//
// A version that also computed the f32 router product (its weight loads before the programmatic-
// launch wait) was faster alone at 1-2 tokens (gpu_moe_bench --routing-only on the H200,
// 2026-12-01: 9.25 against 10.09 us at one token) but slower in the backend's decode chain
// (gpu_backend_bench on q3n-80b, same device call: 3.813 against 3.553 ms a token), so it was
// removed; one-token steps keep the router product and the one-warp plan (moe_stage.cc).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_PLAN_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_PLAN_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "gpu_service/backends/cuda/moe/device_plan.cuh"

namespace tandem::cuda {

// Most experts the fused kernel routes (a warp keeps a token's probabilities in registers), and
// the most it plans (its block plan's count arrays).
inline constexpr int kRoutePlanMaxExperts = kDeviceRouteMaxExperts;

struct RoutePlanArgs {
  // plan.logits: n × E router logits (device). plan.experts must equal plan.experts_out;
  // plan.weights_out receives the weights. The rest of plan as for LaunchPlanMoeOnDevice.
  DeviceMoePlanArgs plan;
  // Device counter of finished blocks: zero before the first launch, left zero by every launch
  // (the last block resets it). One per stream: launches sharing it must not run concurrently.
  unsigned* counter = nullptr;
};

// Steps of at most this many tokens are the decode path's; longer ones are prefill steps (moe_stage.h's
// kDevicePlanMaxTokens).
inline constexpr int kRoutePlanDecodeMaxTokens = 64;

// Prefill steps (more than kRoutePlanDecodeMaxTokens tokens) run the kernel with blocks of 16 warps
// (the last block plans with 512 threads) instead of 4: measured faster (docs/PERF.md, sixth session).
// cudaErrorInvalidValue for n < 1, K outside [1, min(E, 32)], E above kRoutePlanMaxExperts, a null
// required pointer or plan.experts != plan.experts_out.
cudaError_t LaunchRoutePlan(const RoutePlanArgs& args, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_PLAN_CUH_
