// The route-and-plan kernel (route_plan.cuh): blocks of kWarps warps (prefill steps: kPrefillWarps);
// with several blocks each warp routes one token and the last block to finish plans; a single block
// routes every token, then plans.
#include "gpu_service/backends/cuda/moe/route_plan.cuh"

#include <cfloat>

#include "gpu_service/backends/cuda/moe/plan_units.cuh"
#include "gpu_service/backends/cuda/moe/route_order.cuh"
#include "gpu_service/backends/cuda/moe/route_warp.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

using route_detail::ExpNonPositive;
using route_detail::LoadLogits;
using route_detail::RouteScratch;
using route_detail::RouteTokenWarp;
using route_detail::WarpTopK;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// Prefill steps (more than kRoutePlanDecodeMaxTokens tokens): blocks of kPrefillWarps warps, so that the
// last block plans the step's n·K pairs with 4x the threads (one block of 128 threads placed the
// 81920 pairs of an 8192-token step alone; the routing itself is spread over the grid either way).
constexpr int kPrefillWarps = 16;

template <int kW>
using Plan = plan_detail::BlockPlan<kW * 32, kRoutePlanMaxExperts>;

// A step of one token routed by the whole block: the f64 exponentials (the routing's largest cost)
// split over the warps, then warp 0 picks and plans. Every thread of the block calls it.
struct OneTokenShared {
  float probs[kRoutePlanMaxExperts];
  double sum[kWarps];
};

// The plan of a one-token step from warp 0's picks in s (K distinct experts): pick k's unit and slot
// are its expert's place among the valid picks in expert order (as WarpPlan orders them).
__device__ void PlanOneToken(const DeviceMoePlanArgs& a, const RouteScratch& s) {
  const int lane = threadIdx.x & 31;
  const int e = lane < a.K ? s.sel_id[lane] : -1;
  const bool valid = lane < a.K && e >= 0 && e < a.E && a.table[e].gate != nullptr;
  const unsigned valid_mask = __ballot_sync(0xFFFFFFFFu, valid);
  if (lane == 0) *a.num_units = __popc(valid_mask);
  if (valid) {
    int r = 0;
    for (int j = 0; j < a.K; ++j) r += (valid_mask >> j & 1u) != 0 && s.sel_id[j] < e ? 1 : 0;
    a.slot[lane] = r;
    ExpertUnit& unit = a.units[r];
    const ExpertLocation where = a.table[e];
    unit.gate = where.gate;
    unit.up = where.up;
    unit.down = where.down;
    unit.rows = 1;
    unit.first_slot = r;
    unit.input_row[0] = 0;
  } else if (lane < a.K) {
    a.slot[lane] = -1;
    *a.error = 1;
  }
  if (a.shared.gate != nullptr && lane == 0) plan_detail::WriteDenseUnit(a.shared, 1, 0, a.shared_units[0]);
}

template <int kPer>
__device__ void RouteAndPlanOneToken(const DeviceMoePlanArgs& a, RouteScratch& s, OneTokenShared& sh) {
  static_assert(kPer % kWarps == 0, "each warp takes kPer / kWarps of a lane's experts");
  constexpr int kPart = kPer / kWarps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float p[kPer];
  const float mx = LoadLogits<kPer>(a.logits, 0, a.E, p);  // every warp: the maximum without a barrier
  double part = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (j / kPart != warp) continue;
    const int i = lane + 32 * j;
    const float ev = ExpNonPositive(p[j] - mx);
    const float v = i < a.E ? ev : 0.0f;
    sh.probs[i] = v;
    part += v;
  }
  for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xFFFFFFFFu, part, off);
  if (lane == 0) sh.sum[warp] = part;
  __syncthreads();
  if (warp != 0) return;
  double sum = 0.0;
  for (int w = 0; w < kWarps; ++w) sum += sh.sum[w];
  const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
  for (int j = 0; j < kPer; ++j) p[j] = lane + 32 * j < a.E ? sh.probs[lane + 32 * j] * inv : -1.0f;
  WarpTopK<kPer>(p, 0, a.E, a.K, a.experts_out, a.weights_out, s);
  PlanOneToken(a, s);
}

// Whether this block finished last; then the counter is reset for the next launch. Every
// thread's global writes before the call are visible to the last block after it.
__device__ bool FinishedLast(unsigned* counter) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
    if (last) *counter = 0;  // every block has counted: nobody reads it again in this launch
  }
  __syncthreads();
  if (last) __threadfence();  // the other blocks' writes before our reads
  return last;
}

template <int kPer, int kW>
__device__ __forceinline__ void RoutePlan(const RoutePlanArgs& a) {
  __shared__ RouteScratch scratch[kW];
  __shared__ union {
    typename Plan<kW>::Storage plan;
    OneTokenShared one;
  } shared;
  const int warp = threadIdx.x >> 5;
  const DeviceMoePlanArgs& p = a.plan;
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  if (gridDim.x > 1) {  // each warp routes a token; the last block plans
    const int t = blockIdx.x * kW + warp;
    if (t < p.n) RouteTokenWarp<kPer>(p.logits, t, p.E, p.K, p.experts_out, p.weights_out, scratch[warp]);
    if (!FinishedLast(a.counter)) return;
  } else {
    if constexpr (kW == kWarps) {  // the prefill variant never has one token
      if (p.n == 1) {
        RouteAndPlanOneToken<kPer>(p, scratch[0], shared.one);
        return;
      }
    }
    for (int t = warp; t < p.n; t += kW) {
      RouteTokenWarp<kPer>(p.logits, t, p.E, p.K, p.experts_out, p.weights_out, scratch[warp]);
    }
    __threadfence();  // the picks (read through L2 by the plan), for every thread of the block
    __syncthreads();
  }
  if (p.n * p.K <= 32 && p.n <= plan_detail::kSmallPlanMaxTokens) {
    if (warp == 0) plan_detail::WarpPlan(p);
  } else {
    Plan<kW>::Run(p, shared.plan);
  }
}

template <int kPer>
__global__ void __launch_bounds__(kThreads) RoutePlanKernel(RoutePlanArgs a) {
  RoutePlan<kPer, kWarps>(a);
}

// One block per SM at most is what the prefill grid needs (n / 16 blocks); saying so lets ptxas keep
// the routing in registers (64 registers and spills without it).
template <int kPer>
__global__ void __launch_bounds__(kPrefillWarps * 32, 1) RoutePlanPrefillKernel(RoutePlanArgs a) {
  RoutePlan<kPer, kPrefillWarps>(a);
}

template <int kPer>
cudaError_t Launch(const RoutePlanArgs& a, cudaStream_t stream) {
  if (a.plan.n > kRoutePlanDecodeMaxTokens) {
    return LaunchPdl(RoutePlanPrefillKernel<kPer>, (a.plan.n + kPrefillWarps - 1) / kPrefillWarps,
                     kPrefillWarps * 32, 0, stream, a);
  }
  return LaunchPdl(RoutePlanKernel<kPer>, (a.plan.n + kWarps - 1) / kWarps, kThreads, 0, stream, a);
}

}  // namespace

cudaError_t LaunchRoutePlan(const RoutePlanArgs& a, cudaStream_t stream) {
  const DeviceMoePlanArgs& p = a.plan;
  if (p.n < 1 || p.K < 1 || p.K > 32 || p.K > p.E || p.E > kRoutePlanMaxExperts || p.logits == nullptr ||
      p.experts == nullptr || p.experts != p.experts_out || p.weights_out == nullptr || p.table == nullptr ||
      p.units == nullptr || p.num_units == nullptr || p.slot == nullptr || p.error == nullptr ||
      a.counter == nullptr || (p.shared.gate != nullptr && p.shared_units == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.E <= 128) return Launch<4>(a, stream);
  if (p.E <= 256) return Launch<8>(a, stream);
  if (p.E <= 512) return Launch<16>(a, stream);
  return Launch<kRoutePlanMaxExperts / 32>(a, stream);
}

}  // namespace tandem::cuda
