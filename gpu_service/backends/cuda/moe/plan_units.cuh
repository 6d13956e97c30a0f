// Device helpers that write the MoE step's work list (ExpertUnits, slots), shared by the planner
// kernels of device_plan.cu and the fused route-and-plan kernel of route_plan.cu so that both make
// the same plan from the same picks. Device code only (include from .cu files).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_PLAN_UNITS_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_PLAN_UNITS_CUH_

#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>

#include "gpu_service/backends/cuda/moe/device_plan.cuh"

namespace tandem::cuda::plan_detail {

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

// Steps of at most this many tokens and 32 pairs are planned by one warp (WarpPlan).
inline constexpr int kSmallPlanMaxTokens = 4;
static_assert(kSmallPlanMaxTokens <= kMaxUnitRows, "the small plan writes one shared unit");

// The plan of a step of at most 32 pairs and kSmallPlanMaxTokens tokens by one warp: no block-wide
// count array, scans or barriers. Lane p owns pair p; pairs of one expert find each other with
// __match_any_sync and rank themselves in pair order (as the host planner does); each expert's
// slot and unit bases are the sums over the step's experts of lower id, so units come in expert
// order like the block plan's. The picks are read through L2 (__ldcg): other blocks of the same
// kernel may have written them.
__device__ __forceinline__ void WarpPlan(const DeviceMoePlanArgs& a) {
  const int lane = threadIdx.x & 31;
  const int pairs = a.n * a.K;
  int e = -1;
  bool valid = false;
  if (lane < pairs) {
    e = __ldcg(a.experts + lane);
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
  if (a.shared.gate != nullptr && lane == 0) WriteDenseUnit(a.shared, a.n, 0, a.shared_units[0]);
}

// The plan of any step by one block of kThreads threads, for E <= kMaxE: pairs are ranked within
// their expert by atomic increments (arrival order), then exclusive scans over the experts give
// each expert's first slot and unit. Every thread of the block must call it.
template <int kThreads, int kMaxE>
struct BlockPlan {
  static constexpr int kItems = kMaxE / kThreads;  // per-expert counts each thread scans
  static constexpr int kBatch = 8;                  // pairs a thread loads at once
  static_assert(kItems * kThreads == kMaxE, "kMaxE must be a multiple of kThreads");
  using Scan = cub::BlockScan<int, kThreads>;
  struct Storage {
    typename Scan::TempStorage scan;
    int count[kMaxE];
    int slot_base[kMaxE];
    int unit_base[kMaxE];
  };

  __device__ static void Run(const DeviceMoePlanArgs& a, Storage& s) {
    const int pairs = a.n * a.K;
    for (int e = threadIdx.x; e < a.E; e += kThreads) s.count[e] = 0;
    __syncthreads();
    // 1. Each pair's rank among its expert's pairs, kept in slot[] for now. kBatch pairs per thread
    // at a time: their loads are issued together (one pair per iteration waited on each load in
    // turn: ~0.5 ms for the 81920 pairs of an 8192-token step).
    for (int p0 = threadIdx.x; p0 < pairs; p0 += kThreads * kBatch) {
      int e[kBatch];
      bool ok[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int p = p0 + u * kThreads;
        e[u] = p < pairs ? __ldcg(a.experts + p) : -1;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) ok[u] = e[u] >= 0 && e[u] < a.E && a.table[e[u]].gate != nullptr;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int p = p0 + u * kThreads;
        if (p >= pairs) break;
        if (ok[u]) {
          a.slot[p] = atomicAdd(&s.count[e[u]], 1);
        } else {
          a.slot[p] = -1;
          *a.error = 1;
        }
      }
    }
    __syncthreads();
    // 2. Exclusive scans of the pair counts (slots) and unit counts over the experts.
    int c[kItems], u[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int e = threadIdx.x * kItems + i;
      c[i] = e < a.E ? s.count[e] : 0;
      u[i] = (c[i] + kMaxUnitRows - 1) / kMaxUnitRows;
    }
    int total_units = 0;
    Scan(s.scan).ExclusiveSum(c, c);
    __syncthreads();
    Scan(s.scan).ExclusiveSum(u, u, total_units);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int e = threadIdx.x * kItems + i;
      if (e < a.E) {
        s.slot_base[e] = c[i];
        s.unit_base[e] = u[i];
      }
    }
    if (threadIdx.x == 0) *a.num_units = total_units;
    __syncthreads();
    // 3. Slots and units (the slot array holds this thread's own ranks from step 1), kBatch pairs
    // at a time as in step 1.
    for (int p0 = threadIdx.x; p0 < pairs; p0 += kThreads * kBatch) {
      int rank[kBatch], e[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int p = p0 + u * kThreads;
        rank[u] = p < pairs ? a.slot[p] : -1;
        e[u] = p < pairs ? __ldcg(a.experts + p) : -1;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (rank[u] < 0) continue;
        PlacePair(a, p0 + u * kThreads, e[u], rank[u], s.count[e[u]], s.slot_base[e[u]] + rank[u], s.unit_base[e[u]]);
      }
    }
    // 4. The shared expert: token t at slot t.
    if (a.shared.gate != nullptr) {
      const int shared_units = (a.n + kMaxUnitRows - 1) / kMaxUnitRows;
      for (int i = threadIdx.x; i < shared_units; i += kThreads) WriteDenseUnit(a.shared, a.n, i, a.shared_units[i]);
    }
  }
};

}  // namespace tandem::cuda::plan_detail

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_PLAN_UNITS_CUH_
