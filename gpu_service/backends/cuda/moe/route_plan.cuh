// Routing and the MoE step's plan in one launch (route_plan.cu), for the device-planned MoE stage:
// optionally the router product itself (f32 ffn_gate_inp, decode-sized steps), then each token's K
// experts and weights exactly as the route kernel (router.cuh) picks them, then the work list the
// device planner (device_plan.cuh) makes.
//
// Why one kernel: at batch-1 decode the router product (4 MB of f32 weights, ~1 us at HBM rate)
// and the one-warp plan kernel cost ~14 us a layer in two launches, mostly latency: the plan
// kernel's one warp computed 512 exponentials and ten rounds of warp argmax alone. Here many warps
// do the product (their weight loads issued before the programmatic-launch wait, so they overlap
// the previous kernel), each token is routed by a warp with a candidate-based top-K (a few
// shuffles instead of K rounds of argmax), and the block that finishes last (an atomic counter)
// plans the step.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_PLAN_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_PLAN_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "gpu_service/backends/cuda/moe/device_plan.cuh"

namespace tandem::cuda {

// Most experts the fused kernel routes (a warp keeps a token's probabilities in registers), and
// the most it plans (its block plan's count arrays).
inline constexpr int kRoutePlanMaxExperts = kDeviceRouteMaxExperts;
// Most tokens whose router product the kernel computes itself (each warp reads every token's x
// for its logit row: beyond a few tokens the dense matrix-vector kernels reuse x better).
inline constexpr int kRoutePlanMaxProductTokens = 4;
// Longest router row (f32 columns) the fused product keeps in registers.
inline constexpr int kRoutePlanMaxProductCols = 2048;

struct RoutePlanArgs {
  // plan.logits: n × E router logits (device). Read when router is null; written (the product)
  // when router is given. plan.experts must equal plan.experts_out; plan.weights_out receives the
  // weights. The rest of plan as for LaunchPlanMoeOnDevice.
  DeviceMoePlanArgs plan;
  // Optional fused router product: logits = router · x, router E rows of h f32 (16-byte aligned),
  // x n × h f32 (16-byte aligned). Needs RoutePlanCanFuseProduct(h, n).
  const float* router = nullptr;
  const float* x = nullptr;
  int h = 0;
  // Device counter of finished blocks: zero before the first launch, left zero by every launch
  // (the last block resets it). One per stream: launches sharing it must not run concurrently.
  unsigned* counter = nullptr;
};

// Process-wide A/B switch for the device-planned MoE stage (moe_stage.cc): the fused kernel (on by
// default) or the previous router product + LaunchPlanMoeOnDevice. The environment variable
// TANDEM_OLD_ROUTE_PLAN set at start-up turns it off, so that end-to-end benchmarks can compare.
inline std::atomic<bool>& RoutePlanSwitch() {
  static std::atomic<bool> fused{std::getenv("TANDEM_OLD_ROUTE_PLAN") == nullptr};
  return fused;
}
inline void SetRoutePlanFused(bool on) { RoutePlanSwitch().store(on, std::memory_order_relaxed); }
inline bool RoutePlanFused() { return RoutePlanSwitch().load(std::memory_order_relaxed); }

// Whether the kernel computes the router product itself for an f32 router of h columns at n tokens.
inline bool RoutePlanCanFuseProduct(int64_t h, int64_t n) {
  return n >= 1 && n <= kRoutePlanMaxProductTokens && h >= 128 && h % 128 == 0 && h <= kRoutePlanMaxProductCols;
}

// Steps up to this many tokens take the fused product in the MoE stage (RoutePlanFusesProduct):
// none. gpu_moe_bench --routing-only on the H200 (2026-12-01, d8110f1), router product + plan per
// layer at E 512, K 10, h 2048, graph-replayed alone: fused 9.25 / 14.32 / 19.46 us at 1 / 2 / 4
// tokens against 10.09 / 15.88 / 12.19 us for the previous product + plan; but in the backend's
// decode chain (gpu_backend_bench on q3n-80b, 7352cee, same device call) batch 1 ran 3.813 ms a
// token with the fused kernel against 3.553 ms with the previous product and plan, so the stage
// keeps the product apart (and one-token steps take the previous plan kernel, moe_stage.cc).
// The fused product stays selectable for the routing bench.
inline constexpr int kRoutePlanFuseProductTokens = 0;

inline bool RoutePlanFusesProduct(int64_t h, int64_t n) {
  return n <= kRoutePlanFuseProductTokens && RoutePlanCanFuseProduct(h, n);
}

// cudaErrorInvalidValue for n < 1, K outside [1, min(E, 32)], E above kRoutePlanMaxExperts, a null
// required pointer, plan.experts != plan.experts_out, or a product that RoutePlanCanFuseProduct
// refuses or whose pointers are not 16-byte aligned.
cudaError_t LaunchRoutePlan(const RoutePlanArgs& args, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_PLAN_CUH_
