// The MoE step's expert work list planned on the GPU, from the router's picks in device memory:
// the same ExpertUnits the host planner (experts.h, PlanMoeStep) makes, without copying the picks
// to the host and waiting for them. With it a decode step has no host round trip per layer and
// can be captured as a CUDA graph.
//
// Pairs (t, k) are grouped by expert; each expert's pairs fill units of up to kMaxUnitRows rows
// at consecutive partial slots. Within an expert the order of the pairs follows the arrival of
// atomic increments (not the token order the host planner uses): every row is computed on its
// own, so the results do not depend on it.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_DEVICE_PLAN_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_DEVICE_PLAN_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/moe/expert_unit.h"

namespace tandem::cuda {

// Most experts per layer the planner handles (one block scans the per-expert counts).
inline constexpr int kDevicePlanMaxExperts = 2048;

// Most experts per layer the fused routing (DeviceMoePlanArgs::logits) handles: a warp keeps a
// token's E logits in registers.
inline constexpr int kDeviceRouteMaxExperts = 1024;

struct DeviceMoePlanArgs {
  // Optional fused routing: when not null, the kernel first routes every token from its E router
  // logits (n × E, device) exactly as the route kernel does (softmax with f64 exponentials and sum,
  // the K most probable experts, ties to the lower id, weights renormalised in f64) and writes the
  // picks to experts_out and the weights to weights_out (n × K each); the plan then reads them.
  // E <= kDeviceRouteMaxExperts.
  const float* logits = nullptr;
  int32_t* experts_out = nullptr;
  float* weights_out = nullptr;
  const int32_t* experts = nullptr;     // n × K picks (device); with logits: experts_out
  int n = 0, K = 0, E = 0;
  const ExpertLocation* table = nullptr;  // E entries (device): where each routed expert's matrices are
  ExpertLocation shared;                // the shared expert (gate == nullptr: none)
  ExpertUnit* units = nullptr;          // out (device): room for n·K units
  int* num_units = nullptr;             // out (device): units written
  int32_t* slot = nullptr;              // out (device): n × K partial row of each pair
  ExpertUnit* shared_units = nullptr;   // out (device): ceil(n / kMaxUnitRows) units, token t at slot t
                                        // (not written when shared.gate is nullptr)
  int* error = nullptr;                 // out (device): set to 1 (never cleared here) when a pick is
                                        // outside [0, E) or names an expert without a location
};

// One block. cudaErrorInvalidValue for n·K < 1, E outside [1, kDevicePlanMaxExperts] or a null
// required pointer. A bad pick gets no unit and slot −1 (its partial row is not written).
cudaError_t LaunchPlanMoeOnDevice(const DeviceMoePlanArgs& args, cudaStream_t stream);

// The units of one expert applied to tokens 0..n−1 (the shared expert), token t at slot t:
// ceil(n / kMaxUnitRows) units, written by the GPU so that a graph can hold them without a host
// upload and without waiting for the routing plan. n >= 1.
cudaError_t LaunchDenseUnitsOnDevice(ExpertLocation where, int n, ExpertUnit* units, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_DEVICE_PLAN_CUH_
