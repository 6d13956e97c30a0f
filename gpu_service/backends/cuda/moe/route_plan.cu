// The route-and-plan kernel (route_plan.cuh): blocks of kWarps warps (prefill steps: kPrefillWarps);
// with several blocks each warp routes one token and the last block to finish plans; a single block
// routes every token, then plans.
#include "gpu_service/backends/cuda/moe/route_plan.cuh"

#include <cfloat>

#include "gpu_service/backends/cuda/moe/plan_units.cuh"
#include "gpu_service/backends/cuda/moe/route_order.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// Prefill steps (more than kRoutePlanDecodeMaxTokens tokens): blocks of kPrefillWarps warps, so that the
// last block plans the step's n·K pairs with 4x the threads (one block of 128 threads placed the
// 81920 pairs of an 8192-token step alone; the routing itself is spread over the grid either way).
constexpr int kPrefillWarps = 16;
constexpr int kMaxCandidates = 64;                    // the top-K candidates a warp ranks directly

template <int kW>
using Plan = plan_detail::BlockPlan<kW * 32, kRoutePlanMaxExperts>;

// Per-warp shared scratch of the routing.
struct RouteScratch {
  float cand_v[kMaxCandidates];
  int cand_id[kMaxCandidates];
  float sel_v[32];
  int sel_id[32];
};

// float(exp(double(d))) for d <= 0 (a logit minus the row's maximum) without branches: CUDA's
// exp(double) takes a branch per call (its range checks), which kept the compiler from
// interleaving a lane's exponentials: each waited out a chain of ~14 dependent f64 FMAs. This is
// that function's fast path (the same reduction, polynomial and scaling, so the same results) on d
// clamped to [-128, 0]: below -128 both give a double under 1e-55, 0 as f32. (-FLT_MAX, a slot
// past E, clamps too; its result is discarded.)
__device__ __forceinline__ float ExpNonPositive(float d) {
  const double x = fmax(static_cast<double>(d), -128.0);
  const double t = fma(x, __longlong_as_double(0x3FF71547652B82FELL), __longlong_as_double(0x4338000000000000LL));
  const int n = __double2loint(t);  // round(x · log2 e), in the low word
  const double k = t + __longlong_as_double(static_cast<long long>(0xC338000000000000ULL));
  double r = fma(k, __longlong_as_double(static_cast<long long>(0xBFE62E42FEFA39EFULL)), x);
  r = fma(k, __longlong_as_double(static_cast<long long>(0xBC7ABC9E3B39803FULL)), r);
  double c = __longlong_as_double(0x3E5ADE1569CE2BDFLL);
  c = fma(c, r, __longlong_as_double(0x3E928AF3FCA213EALL));
  c = fma(c, r, __longlong_as_double(0x3EC71DEE62401315LL));
  c = fma(c, r, __longlong_as_double(0x3EFA01997C89EB71LL));
  c = fma(c, r, __longlong_as_double(0x3F2A01A014761F65LL));
  c = fma(c, r, __longlong_as_double(0x3F56C16C1852B7AFLL));
  c = fma(c, r, __longlong_as_double(0x3F81111111122322LL));
  c = fma(c, r, __longlong_as_double(0x3FA55555555502A1LL));
  c = fma(c, r, __longlong_as_double(0x3FC5555555555511LL));
  c = fma(c, r, __longlong_as_double(0x3FE000000000000BLL));
  c = fma(c, r, 1.0);
  c = fma(c, r, 1.0);
  // 2^n by adding n to the exponent field (n in [-185, 0]: the result stays a normal double).
  const double e = __hiloint2double(__double2hiint(c) + (n << 20), __double2loint(c));
  return static_cast<float>(e);
}

// The top-K of one token's probabilities p (lane l holds experts l, l + 32, ...; -1 past E) by one
// warp, as the route kernel picks them (the K most probable, ties to the lower id; weights
// renormalised in f64 in pick order). Leaves the picks in s.sel_id / s.sel_v (pick order) and
// writes them to experts / weights for token t.
//
// Top-K without K rounds of warp argmax: τ = the K-th largest of the 32 lane maxima bounds the
// K-th largest probability from below (K lanes hold a value >= τ), so the K picks are among the
// values >= τ: usually a few more than K. Those candidates are compacted into shared memory and
// each ranks itself against the others; a pick's rank is its place. More than kMaxCandidates
// candidates (many equal probabilities) take the K rounds of argmax instead.
template <int kPer>
__device__ void WarpTopK(float (&p)[kPer], int t, int E, int K, int32_t* experts, float* weights, RouteScratch& s) {
  const int lane = threadIdx.x & 31;
  float lane_max = -1.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) lane_max = fmaxf(lane_max, p[j]);
  // τ: the largest lane maximum with at least K lane maxima >= it (K <= min(E, 32)).
  int at_least = 0;
  for (int src = 0; src < 32; ++src) at_least += __shfl_sync(0xFFFFFFFFu, lane_max, src) >= lane_max ? 1 : 0;
  const unsigned bits = at_least >= K && lane_max >= 0.0f ? __float_as_uint(lane_max) : 0u;  // >= 0: ordered as floats
  const float tau = __uint_as_float(__reduce_max_sync(0xFFFFFFFFu, bits));
  int mine = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) mine += p[j] >= tau ? 1 : 0;
  int incl = mine;
  for (int off = 1; off < 32; off <<= 1) {
    const int o = __shfl_up_sync(0xFFFFFFFFu, incl, off);
    if (lane >= off) incl += o;
  }
  const int candidates = __shfl_sync(0xFFFFFFFFu, incl, 31);
  if (candidates <= kMaxCandidates) {
    int w = incl - mine;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (p[j] >= tau) {
        s.cand_v[w] = p[j];
        s.cand_id[w] = lane + 32 * j;
        ++w;
      }
    }
    __syncwarp();
    for (int c = lane; c < candidates; c += 32) {
      const float v = s.cand_v[c];
      const int id = s.cand_id[c];
      int rank = 0;
      for (int j = 0; j < candidates; ++j) rank += RouteBefore(s.cand_v[j], s.cand_id[j], v, id) ? 1 : 0;
      if (rank < K) {
        s.sel_v[rank] = v;
        s.sel_id[rank] = id;
      }
    }
  } else {
    for (int k = 0; k < K; ++k) {
      float bv;
      int bid;
      WarpTakeFirst(p, lane, E, bv, bid);
      if (lane == 0) {
        s.sel_v[k] = bv;
        s.sel_id[k] = bid;
      }
    }
  }
  __syncwarp();
  double picked_sum = 0.0;
  for (int k = 0; k < K; ++k) picked_sum += s.sel_v[k];  // in pick order, as RouteTokens
  if (lane < K) {
    const int64_t o = static_cast<int64_t>(t) * K + lane;
    experts[o] = s.sel_id[lane];
    weights[o] = static_cast<float>(s.sel_v[lane] / picked_sum);
  }
  __syncwarp();  // the scratch is reused by the warp's next token
}

// Token t's logits into p (lane l holds experts l, l + 32, ...), read through L2 (other blocks of
// this kernel may have written them), and their maximum.
template <int kPer>
__device__ float LoadLogits(const float* logits, int t, int E, float (&p)[kPer]) {
  const int lane = threadIdx.x & 31;
  const float* row = logits + static_cast<int64_t>(t) * E;
  float mx = -FLT_MAX;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    p[j] = i < E ? __ldcg(row + i) : -FLT_MAX;
    mx = fmaxf(mx, p[j]);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
  return mx;
}

// Routes token t with one warp, with the route kernel's arithmetic (softmax: exponentials rounded
// from f64, the sum in f64), then WarpTopK.
template <int kPer>
__device__ void RouteTokenWarp(const float* logits, int t, int E, int K, int32_t* experts, float* weights,
                               RouteScratch& s) {
  const int lane = threadIdx.x & 31;
  float p[kPer];
  const float mx = LoadLogits<kPer>(logits, t, E, p);
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const float v = ExpNonPositive(p[j] - mx);  // every slot: no branch between the exponentials
    p[j] = lane + 32 * j < E ? v : 0.0f;
    sum += p[j];
  }
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
  const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
  for (int j = 0; j < kPer; ++j) p[j] = lane + 32 * j < E ? p[j] * inv : -1.0f;  // probabilities are >= 0
  WarpTopK<kPer>(p, t, E, K, experts, weights, s);
}

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
  if (a.plan.n > kRoutePlanDecodeMaxTokens && RoutePlanPrefillWide()) {
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
