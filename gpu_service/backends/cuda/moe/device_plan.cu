#include "gpu_service/backends/cuda/moe/device_plan.cuh"

#include <cfloat>

#include <cub/block/block_scan.cuh>

#include "gpu_service/backends/cuda/moe/route_order.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kItems = kDevicePlanMaxExperts / kThreads;  // per-expert counts each thread scans

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
    float bv = -FLT_MAX;
    int bid = E;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (RouteBefore(p[j], lane + 32 * j, bv, bid)) {
        bv = p[j];
        bid = lane + 32 * j;
      }
    }
    WarpRouteFirst(bv, bid);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (lane + 32 * j == bid) p[j] = -FLT_MAX;  // the owner drops the pick from later rounds
    }
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

// Pair p (token p / K) of expert e has rank `rank` among the expert's `count` pairs and slot s; its
// expert's units start at unit_base. Writes the pair's slot and unit row; the pair of rank
// 0 mod kMaxUnitRows also writes its unit's header.
__device__ __forceinline__ void PlacePair(const DeviceMoePlanArgs& a, int p, int e, int rank, int count, int s,
                                          int unit_base) {
  a.slot[p] = s;
  ExpertUnit& unit = a.units[unit_base + rank / kMaxUnitRows];
  unit.input_row[rank % kMaxUnitRows] = p / a.K;
  if (rank % kMaxUnitRows == 0) {
    const ExpertLocation where = a.table[e];
    unit.gate = where.gate;
    unit.up = where.up;
    unit.down = where.down;
    unit.rows = min(kMaxUnitRows, count - rank);
    unit.first_slot = s;
  }
}

// Unit i of an expert applied to tokens 0..n-1 (the shared expert): token t at slot t.
__device__ __forceinline__ void WriteDenseUnit(ExpertLocation where, int n, int i, ExpertUnit& unit) {
  unit.gate = where.gate;
  unit.up = where.up;
  unit.down = where.down;
  unit.rows = min(kMaxUnitRows, n - i * kMaxUnitRows);
  unit.first_slot = i * kMaxUnitRows;
  for (int r = 0; r < kMaxUnitRows; ++r) unit.input_row[r] = r < unit.rows ? i * kMaxUnitRows + r : 0;
}

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
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int count[kDevicePlanMaxExperts];
  __shared__ int slot_base[kDevicePlanMaxExperts];
  __shared__ int unit_base[kDevicePlanMaxExperts];
  const int pairs = a.n * a.K;
  for (int e = threadIdx.x; e < a.E; e += kThreads) count[e] = 0;
  __syncthreads();
  // 1. Each pair's rank among its expert's pairs, kept in slot[] for now.
  for (int p = threadIdx.x; p < pairs; p += kThreads) {
    const int e = a.experts[p];
    if (e < 0 || e >= a.E || a.table[e].gate == nullptr) {
      a.slot[p] = -1;
      *a.error = 1;
    } else {
      a.slot[p] = atomicAdd(&count[e], 1);
    }
  }
  __syncthreads();
  // 2. Exclusive scans of the pair counts (slots) and unit counts over the experts.
  int c[kItems], u[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int e = threadIdx.x * kItems + i;
    c[i] = e < a.E ? count[e] : 0;
    u[i] = (c[i] + kMaxUnitRows - 1) / kMaxUnitRows;
  }
  int total_units = 0;
  Scan(scan_storage).ExclusiveSum(c, c);
  __syncthreads();
  Scan(scan_storage).ExclusiveSum(u, u, total_units);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int e = threadIdx.x * kItems + i;
    if (e < a.E) {
      slot_base[e] = c[i];
      unit_base[e] = u[i];
    }
  }
  if (threadIdx.x == 0) *a.num_units = total_units;
  __syncthreads();
  // 3. Slots and units. The pair of rank 0 mod kMaxUnitRows writes its unit's header.
  for (int p = threadIdx.x; p < pairs; p += kThreads) {
    const int rank = a.slot[p];
    if (rank < 0) continue;
    const int e = a.experts[p];
    PlacePair(a, p, e, rank, count[e], slot_base[e] + rank, unit_base[e]);
  }
  // 4. The shared expert: token t at slot t.
  if (a.shared.gate != nullptr) {
    const int shared_units = (a.n + kMaxUnitRows - 1) / kMaxUnitRows;
    for (int i = threadIdx.x; i < shared_units; i += kThreads) WriteDenseUnit(a.shared, a.n, i, a.shared_units[i]);
  }
}

// The same plan for a step of at most 32 pairs and kSmallPlanMaxTokens tokens (decode of one to a
// few sequences) in one warp: no block-wide count array, scans or barriers, so the kernel costs
// about its memory latencies (the block kernel above took ~15 us for one token). Lane p owns pair
// p; pairs of one expert find each other with __match_any_sync and rank themselves in pair order
// (as the host planner does); each expert's slot and unit bases are the sums over the step's
// experts of lower id, so units come in expert order like the block kernel's.
constexpr int kSmallPlanMaxTokens = 4;

template <int kPer>
__global__ void __launch_bounds__(32) PlanSmallKernel(DeviceMoePlanArgs a) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int lane = threadIdx.x;
  if (a.logits != nullptr) {
    for (int t = 0; t < a.n; ++t) RouteToken<kPer>(a.logits, t, a.E, a.K, a.experts_out, a.weights_out);
    __syncwarp();  // the picks were written by lane 0: visible to the warp after this
  }
  const int pairs = a.n * a.K;
  int e = -1;
  bool valid = false;
  if (lane < pairs) {
    e = a.experts[lane];
    valid = e >= 0 && e < a.E && a.table[e].gate != nullptr;
    if (!valid) {
      a.slot[lane] = -1;
      *a.error = 1;
    }
  }
  // Invalid lanes get keys no expert has (and no other lane), so they match only themselves.
  const int key = valid ? e : a.E + lane;
  const unsigned peers = __match_any_sync(0xFFFFFFFFu, key);
  const int rank = __popc(peers & ((1u << lane) - 1u));
  const int count = __popc(peers);
  const bool leader = valid && rank == 0;
  int slot_base = 0, unit_base = 0, total_units = 0;
  for (int j = 0; j < 32; ++j) {
    const int kj = __shfl_sync(0xFFFFFFFFu, key, j);
    const int cj = __shfl_sync(0xFFFFFFFFu, count, j);
    const bool lj = __shfl_sync(0xFFFFFFFFu, leader ? 1 : 0, j) != 0;
    if (!lj) continue;
    const int uj = (cj + kMaxUnitRows - 1) / kMaxUnitRows;
    total_units += uj;
    if (kj < key) {
      slot_base += cj;
      unit_base += uj;
    }
  }
  if (lane == 0) *a.num_units = total_units;
  if (valid) PlacePair(a, lane, e, rank, count, slot_base + rank, unit_base);
  // n <= kSmallPlanMaxTokens <= kMaxUnitRows: one shared unit.
  if (a.shared.gate != nullptr && lane == 0) WriteDenseUnit(a.shared, a.n, 0, a.shared_units[0]);
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
    static_assert(kSmallPlanMaxTokens <= kMaxUnitRows, "the small plan writes one shared unit");
    if (a.E <= 128) return LaunchPdl(PlanSmallKernel<4>, 1, 32, 0, stream, a);
    if (a.E <= 256) return LaunchPdl(PlanSmallKernel<8>, 1, 32, 0, stream, a);
    if (a.E <= 512) return LaunchPdl(PlanSmallKernel<16>, 1, 32, 0, stream, a);
    return LaunchPdl(PlanSmallKernel<kDeviceRouteMaxExperts / 32>, 1, 32, 0, stream, a);
  }
  return LaunchPdl(PlanKernel, 1, kThreads, 0, stream, a);
}

}  // namespace tandem::cuda
