#include "gpu_service/backends/cuda/moe/device_plan.cuh"

#include <cfloat>

#include "gpu_service/backends/cuda/moe/plan_units.cuh"
#include "gpu_service/backends/cuda/moe/route_order.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 512;

// One warp routes token t: lane l holds experts l, l + 32, ... in registers.
template <int kPer>
__device__ void RouteToken(const float* logits, int t, int E, int K, int32_t* experts, float* weights) {
  const int lane = threadIdx.x & 31;
  const float* row = logits + static_cast<int64_t>(t) * E;
  float p[kPer];
  float mx = -FLT_MAX;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    p[j] = i < E ? row[i] : -FLT_MAX;
    mx = fmaxf(mx, p[j]);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    p[j] = i < E ? static_cast<float>(exp(static_cast<double>(p[j] - mx))) : 0.0f;
    sum += p[j];
  }
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
  const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
  for (int j = 0; j < kPer; ++j) p[j] = lane + 32 * j < E ? p[j] * inv : -FLT_MAX;
  double picked_sum = 0.0;
  for (int k = 0; k < K; ++k) {
    float bv;
    int bid;
    WarpTakeFirst(p, lane, E, bv, bid);
    if (lane == 0) {
      experts[static_cast<int64_t>(t) * K + k] = bid;
      weights[static_cast<int64_t>(t) * K + k] = bv;
    }
    picked_sum += bv;  // the same value in every lane, summed in pick order
  }
  __syncwarp();
  if (lane < K) {
    const int64_t o = static_cast<int64_t>(t) * K + lane;
    weights[o] = static_cast<float>(weights[o] / picked_sum);
  }
}

template <int kPer>
__device__ void RouteTokens(const DeviceMoePlanArgs& a) {
  for (int t = threadIdx.x / 32; t < a.n; t += kThreads / 32) RouteToken<kPer>(a.logits, t, a.E, a.K, a.experts_out, a.weights_out);
}

using plan_detail::WriteDenseUnit;

__global__ void __launch_bounds__(kThreads) PlanKernel(DeviceMoePlanArgs a) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  if (a.logits != nullptr) {
    if (a.E <= 128) {
      RouteTokens<4>(a);
    } else if (a.E <= 256) {
      RouteTokens<8>(a);
    } else if (a.E <= 512) {
      RouteTokens<16>(a);
    } else {
      RouteTokens<kDeviceRouteMaxExperts / 32>(a);
    }
    __threadfence_block();
    __syncthreads();
  }
  __shared__ typename plan_detail::BlockPlan<kThreads, kDevicePlanMaxExperts>::Storage storage;
  plan_detail::BlockPlan<kThreads, kDevicePlanMaxExperts>::Run(a, storage);
}

// The same plan for a step of at most 32 pairs and kSmallPlanMaxTokens tokens (decode of one to a
// few sequences) in one warp (plan_units.cuh WarpPlan): the block kernel above took ~15 us for one
// token.
using plan_detail::kSmallPlanMaxTokens;

template <int kPer>
__global__ void __launch_bounds__(32) PlanSmallKernel(DeviceMoePlanArgs a) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  if (a.logits != nullptr) {
    for (int t = 0; t < a.n; ++t) RouteToken<kPer>(a.logits, t, a.E, a.K, a.experts_out, a.weights_out);
    __syncwarp();  // the picks were written by lane 0: visible to the warp after this
  }
  plan_detail::WarpPlan(a);
}

__global__ void DenseUnitsKernel(ExpertLocation where, int n, ExpertUnit* units) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i * kMaxUnitRows >= n) return;
  WriteDenseUnit(where, n, i, units[i]);
}

}  // namespace

cudaError_t LaunchDenseUnitsOnDevice(ExpertLocation where, int n, ExpertUnit* units, cudaStream_t stream) {
  if (n < 1 || units == nullptr) return cudaErrorInvalidValue;
  const int count = (n + kMaxUnitRows - 1) / kMaxUnitRows;
  return LaunchPdl(DenseUnitsKernel, (count + 127) / 128, 128, 0, stream, where, n, units);
}

cudaError_t LaunchPlanMoeOnDevice(const DeviceMoePlanArgs& a, cudaStream_t stream) {
  if (a.logits != nullptr &&
      (a.E > kDeviceRouteMaxExperts || a.K > 32 || a.experts_out == nullptr || a.weights_out == nullptr ||
       a.experts != a.experts_out)) {
    return cudaErrorInvalidValue;
  }
  if (a.n < 1 || a.K < 1 || a.E < 1 || a.E > kDevicePlanMaxExperts || a.experts == nullptr || a.table == nullptr ||
      a.units == nullptr || a.num_units == nullptr || a.slot == nullptr || a.error == nullptr ||
      (a.shared.gate != nullptr && a.shared_units == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (a.n * a.K <= 32 && a.n <= kSmallPlanMaxTokens) {
    if (a.E <= 128) return LaunchPdl(PlanSmallKernel<4>, 1, 32, 0, stream, a);
    if (a.E <= 256) return LaunchPdl(PlanSmallKernel<8>, 1, 32, 0, stream, a);
    if (a.E <= 512) return LaunchPdl(PlanSmallKernel<16>, 1, 32, 0, stream, a);
    return LaunchPdl(PlanSmallKernel<kDeviceRouteMaxExperts / 32>, 1, 32, 0, stream, a);
  }
  return LaunchPdl(PlanKernel, 1, kThreads, 0, stream, a);
}

}  // namespace tandem::cuda
