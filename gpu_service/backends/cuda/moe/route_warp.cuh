// The warp routing of the route-and-plan kernels (route_plan.cu, route_plan_grid.cu): one warp
// routes one token from its router logits exactly as the route kernel (router.cuh) does. Moved
// unchanged out of route_plan.cu so that both kernels share it. Device code only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_WARP_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_WARP_CUH_

#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "gpu_service/backends/cuda/moe/route_order.cuh"

namespace tandem::cuda::route_detail {

constexpr int kMaxCandidates = 64;  // the top-K candidates a warp ranks directly

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

}  // namespace tandem::cuda::route_detail

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_WARP_CUH_
