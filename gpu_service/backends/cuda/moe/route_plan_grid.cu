// The grid-wide route-plan-tiles kernel (route_plan_grid.cuh).
//
// One launch of G co-resident blocks of kThreads threads; block b owns the contiguous tokens
// [b·chunk, (b + 1)·chunk) (chunk <= kRoutePlanGridBlockTokens), so block order is token order.
//  A. Each warp routes tokens of its block (route_warp.cuh, the route kernel's arithmetic); each
//     valid pick sets bit (token - first token) of its expert's mask in shared memory. A pair's
//     rank among its block's pairs of the same expert is then the popcount of the lower bits (a
//     token picks an expert at most once), and the block's count the popcount of the mask. The
//     counts go to col[e·G + b] in global memory.  Grid barrier.
//  B. Column scans, spread over the blocks (expert e by a warp of block e mod G): col[e·G + b]
//     becomes the pairs of expert e in blocks before b, total[e] their sum.  Grid barrier.
//  C. Every block scans total[] over the experts (slot and unit bases, the tile groups: runs of
//     non-empty experts with equal locations, as GroupUnits merges consecutive units), then
//     writes its own pairs (slot, unit input row, index[slot]) and a 1/G share of the unit headers
//     and tiles (each found by a binary search of the bases). Block 0 writes the counts.
// So within an expert pairs come in pair order (the host planner's order), and units and tiles are
// those of the old path (route_plan.cu + prefill_tiles_device.cu), which are order-free.
//
// The barrier needs every block resident at once: the grid is at most the occupancy calculator's
// blocks per SM x SMs, and the launch is cooperative (the runtime refuses a grid that cannot be
// co-resident). A barrier waiting over 2 s traps (a clean launch failure, not a hang).
#include "gpu_service/backends/cuda/moe/route_plan_grid.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include <cub/block/block_scan.cuh>
#include <cuda/functional>

#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/load_acquire.cuh"
#include "gpu_service/backends/cuda/moe/plan_units.cuh"
#include "gpu_service/backends/cuda/moe/route_warp.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/spin_wait.cuh"

namespace tandem::cuda {
namespace {

using route_detail::RouteScratch;
using route_detail::RouteTokenWarp;

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kE = kRoutePlanGridMaxExperts;  // thread e owns expert e in the scans
static_assert(kE == kThreads, "one expert per thread in phase C");
constexpr int kMaskWords = kRoutePlanGridBlockTokens / 64;
static_assert(kMaskWords * 64 == kRoutePlanGridBlockTokens, "whole mask words");
// scratch: [0] barrier arrivals, [1] barrier generation, [2, 4) unused, [4, 4 + E) totals, then
// the E x G column counts / offsets.
constexpr int kHeaderInts = 4;

using Scan = cub::BlockScan<int, kThreads>;

struct Shared {
  RouteScratch route[kWarps];
  unsigned long long mask[kE][kMaskWords];
  int slot_base[kE];
  int unit_base[kE];
  int group_first[kE];   // group g's first slot
  int group_expert[kE];  // group g's first expert
  int group_tile[kE];    // group g's first tile
  typename Scan::TempStorage scan;
};

// Every block waits until all gridDim.x have arrived; global writes before the call are visible
// to every block after it. words[0] counts arrivals (back to 0 when the barrier opens, so the
// scratch needs no reset between launches), words[1] is the generation the last arrival bumps.
// A block that never arrives (the grid not co-resident) makes the others' wait trap (spin_wait.cuh).
__device__ void GridBarrier(unsigned* words) {
  __syncthreads();
  if (threadIdx.x == 0) {
    // Read before arriving: the generation cannot move until this block has arrived.
    const unsigned gen = LoadAcquire(words + 1);
    __threadfence();
    if (atomicAdd(words, 1u) == gridDim.x - 1) {
      atomicExch(words, 0u);
      __threadfence();
      atomicAdd(words + 1, 1u);
    } else {
      SpinUntil<100>([&] { return LoadAcquire(words + 1) != gen; });
    }
    __threadfence();
  }
  __syncthreads();
}

__device__ __forceinline__ bool Misaligned(const void* p, int align) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % static_cast<unsigned>(align) != 0;
}

__device__ __forceinline__ bool SameLocation(const ExpertLocation& x, const ExpertLocation& y) {
  return x.gate == y.gate && x.up == y.up && x.down == y.down;
}

__device__ __forceinline__ bool ValidPick(const DeviceMoePlanArgs& p, int e) {
  return e >= 0 && e < p.E && p.table[e].gate != nullptr;
}

// The last index i in [0, count) with v[i] <= x (v non-decreasing, v[0] <= x).
__device__ __forceinline__ int LastAtMost(const int* v, int count, int x) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (v[mid] <= x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

template <int kPer>
__global__ void __launch_bounds__(kThreads, 1) RoutePlanGridKernel(RoutePlanGridArgs a, int chunk) {
  __shared__ Shared sh;
  const DeviceMoePlanArgs& p = a.plan;
  const DevicePrefillTilesArgs& tl = a.tiles;
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int G = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int t0 = min(p.n, b * chunk), t1 = min(p.n, t0 + chunk);
  unsigned* barrier = reinterpret_cast<unsigned*>(a.scratch);
  int* total = a.scratch + kHeaderInts;
  int* col = total + p.E;
  for (int i = tid; i < kE * kMaskWords; i += kThreads) (&sh.mask[0][0])[i] = 0ull;
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();        // dependents launch once every block got here: all of ours are resident
  __syncthreads();

  // A. Routing and the block's masks and counts.
  for (int t = t0 + warp; t < t1; t += kWarps) {
    RouteTokenWarp<kPer>(p.logits, t, p.E, p.K, p.experts_out, p.weights_out, sh.route[warp]);
    if (lane < p.K) {
      const int e = sh.route[warp].sel_id[lane];
      if (ValidPick(p, e)) atomicOr(&sh.mask[e][(t - t0) >> 6], 1ull << ((t - t0) & 63));
    }
    __syncwarp();  // sel_id is rewritten by the warp's next token
  }
  __syncthreads();
  for (int e = tid; e < p.E; e += kThreads) {
    int c = 0;
#pragma unroll
    for (int w = 0; w < kMaskWords; ++w) c += __popcll(sh.mask[e][w]);
    col[e * G + b] = c;
  }
  GridBarrier(barrier);

  // B. Column scans: expert e by warp (e / G) % kWarps of block e % G.
  for (int e = b + G * warp; e < p.E; e += G * kWarps) {
    int carry = 0;
    for (int base = 0; base < G; base += 32) {
      const int i = base + lane;
      const int c = i < G ? __ldcg(col + e * G + i) : 0;
      int incl = c;
      for (int off = 1; off < 32; off <<= 1) {
        const int o = __shfl_up_sync(0xFFFFFFFFu, incl, off);
        if (lane >= off) incl += o;
      }
      if (i < G) col[e * G + i] = carry + incl - c;
      carry += __shfl_sync(0xFFFFFFFFu, incl, 31);
    }
    if (lane == 0) total[e] = carry;
  }
  GridBarrier(barrier);

  // C1. Bases over the experts (thread e: expert e).
  const int e = tid;
  const int count = e < p.E ? __ldcg(total + e) : 0;
  int slot_base = 0, unit_base = 0, slots = 0, units = 0;
  Scan(sh.scan).ExclusiveSum(count, slot_base, slots);
  __syncthreads();
  Scan(sh.scan).ExclusiveSum((count + kMaxUnitRows - 1) / kMaxUnitRows, unit_base, units);
  sh.slot_base[e] = slot_base;
  sh.unit_base[e] = unit_base;
  const bool with_tiles = tl.tiles != nullptr;
  int groups = 0;
  bool bad = false;
  if (with_tiles) {
    // C2. Tile groups: a non-empty expert starts one unless the previous non-empty expert has the
    // same matrices (GroupUnits' rule; the slots of the two always follow each other).
    ExpertLocation where{};
    if (count > 0) where = p.table[e];
    bad = count > 0 && (Misaligned(where.gate, tl.gate_up_align) || Misaligned(where.up, tl.gate_up_align) ||
                        Misaligned(where.down, tl.down_align));
    __syncthreads();
    int prev = -1;
    Scan(sh.scan).ExclusiveScan(count > 0 ? e : -1, prev, -1, ::cuda::maximum<int>{});
    const bool start = count > 0 && (prev < 0 || !SameLocation(p.table[prev], where));
    __syncthreads();
    int g = 0;
    Scan(sh.scan).InclusiveSum(start ? 1 : 0, g, groups);
    if (start) {
      sh.group_first[g - 1] = slot_base;
      sh.group_expert[g - 1] = e;
    }
    __syncthreads();
    int tiles = 0;
    if (tid < groups) {
      const int end = tid + 1 < groups ? sh.group_first[tid + 1] : slots;
      tiles = (end - sh.group_first[tid] + tl.tile_rows - 1) / tl.tile_rows;
    }
    int first_tile = 0, all_tiles = 0;
    Scan(sh.scan).ExclusiveSum(tiles, first_tile, all_tiles);
    if (tid < groups) sh.group_tile[tid] = first_tile;
    bad = __syncthreads_or(bad ? 1 : 0) != 0;  // also the barrier before group_tile is read
    bad = bad || all_tiles > tl.max_tiles || units > tl.max_units || slots > tl.max_slots || p.n > tl.max_input_rows;
    // C3. This block's share of the tiles: tile j of group g (found by its first tile).
    for (int j = b * kThreads + tid; j < min(all_tiles, tl.max_tiles); j += G * kThreads) {
      const int gj = LastAtMost(sh.group_tile, groups, j);
      const int k = j - sh.group_tile[gj];
      const int first = sh.group_first[gj];
      const int end = gj + 1 < groups ? sh.group_first[gj + 1] : slots;
      const ExpertLocation w = p.table[sh.group_expert[gj]];
      tl.tiles[j] = PrefillTile{w.gate, w.up, w.down, first + k * tl.tile_rows, min(tl.tile_rows, end - first - k * tl.tile_rows)};
    }
    if (b == 0 && tid == 0) {
      if (bad) {
        *(tl.error != nullptr ? tl.error : p.error) = 1;
        *tl.num_tiles = 0;
      } else {
        *tl.num_tiles = all_tiles;
      }
    }
  } else {
    __syncthreads();  // the bases, for C4 and C5
  }
  if (b == 0 && tid == 0) *p.num_units = units;

  // C4. This block's share of the unit headers: unit u of the expert whose units start at or
  // before it (the last such: experts without units share their base with the next one).
  for (int u = b * kThreads + tid; u < units; u += G * kThreads) {
    const int eu = LastAtMost(sh.unit_base, p.E, u);
    const int c = __ldcg(total + eu);
    const int r0 = (u - sh.unit_base[eu]) * kMaxUnitRows;
    const ExpertLocation where = p.table[eu];
    ExpertUnit& unit = p.units[u];
    unit.gate = where.gate;
    unit.up = where.up;
    unit.down = where.down;
    unit.rows = min(kMaxUnitRows, c - r0);
    unit.first_slot = sh.slot_base[eu] + r0;
  }

  // C5. The block's own pairs, in pair order: rank = pairs of the expert in earlier blocks + the
  // block's earlier tokens with that pick.
  for (int q = tid; q < (t1 - t0) * p.K; q += kThreads) {
    const int pi = t0 * p.K + q;
    const int t = pi / p.K, r = t - t0;
    const int ep = __ldcg(p.experts + pi);
    if (!ValidPick(p, ep)) {
      p.slot[pi] = -1;
      *p.error = 1;
      continue;
    }
    int rank = __ldcg(col + ep * G + b);
#pragma unroll
    for (int w = 0; w < kMaskWords; ++w) {
      const unsigned long long m = sh.mask[ep][w];
      if (w < (r >> 6)) {
        rank += __popcll(m);
      } else if (w == (r >> 6)) {
        rank += __popcll(m & ((1ull << (r & 63)) - 1ull));
      }
    }
    const int s = sh.slot_base[ep] + rank;
    p.slot[pi] = s;
    p.units[sh.unit_base[ep] + rank / kMaxUnitRows].input_row[rank % kMaxUnitRows] = t;
    if (with_tiles) tl.index[s] = t;
  }

  // C6. The shared expert's units (token t at slot t), spread over the blocks.
  if (p.shared.gate != nullptr) {
    const int shared_units = (p.n + kMaxUnitRows - 1) / kMaxUnitRows;
    for (int i = b * kThreads + tid; i < shared_units; i += G * kThreads) {
      plan_detail::WriteDenseUnit(p.shared, p.n, i, p.shared_units[i]);
    }
  }
}

// Co-resident blocks of the kPer instantiation on the current device (cached per device).
template <int kPer>
int Capacity() {
  static std::atomic<int> cache[32];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 0;
  if (dev < 32) {
    if (const int c = cache[dev].load(std::memory_order_relaxed); c > 0) return c;
  }
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, RoutePlanGridKernel<kPer>, kThreads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const int c = sms * per_sm;
  if (dev < 32 && c > 0) cache[dev].store(c, std::memory_order_relaxed);
  return c;
}

int CapacityFor(int E) {
  if (E <= 128) return Capacity<4>();
  if (E <= 256) return Capacity<8>();
  return Capacity<16>();
}

// TANDEM_ROUTE_PLAN_GRID_BLOCKS=N (read once; N >= 1) caps the grid below the co-resident bound,
// for A/B runs: fewer blocks hold fewer SMs at the barriers (the shared expert's GEMMs run beside
// this kernel on the side stream) but route more tokens per warp. Unset or invalid: no cap.
int GridCap() {
  static const int cap = static_cast<int>(EnvInteger("TANDEM_ROUTE_PLAN_GRID_BLOCKS", 1 << 30, 1, 1 << 30));
  return cap;
}

// Tokens per block for n tokens: about one per warp up to the co-resident bound, then equal
// contiguous chunks (at most kRoutePlanGridBlockTokens where n <= that x capacity). The grid is
// ceil(n / chunk) blocks: every block gets at least one token.
int ChunkTokens(int n, int capacity) {
  const int g0 = std::min((n + kWarps - 1) / kWarps, capacity);
  return (n + g0 - 1) / g0;
}

// Whether cooperative launches with programmatic stream serialization were accepted (-1: not
// tried yet; 0: refused once, so launches go without PDL).
std::atomic<int> g_pdl_with_cooperative{-1};

template <int kPer>
cudaError_t Launch(const RoutePlanGridArgs& a, int G, int chunk, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(G));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeCooperative;
  attribute[0].val.cooperative = 1;
  attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  const bool pdl = PdlEnabled() && g_pdl_with_cooperative.load(std::memory_order_relaxed) != 0;
  config.numAttrs = pdl ? 2 : 1;
  cudaError_t err = cudaLaunchKernelEx(&config, RoutePlanGridKernel<kPer>, a, chunk);
  if (pdl) {
    if (err == cudaSuccess) {
      g_pdl_with_cooperative.store(1, std::memory_order_relaxed);
    } else if (g_pdl_with_cooperative.load(std::memory_order_relaxed) < 0) {
      // The driver refused the pair of attributes: cooperative alone from now on.
      (void)cudaGetLastError();
      g_pdl_with_cooperative.store(0, std::memory_order_relaxed);
      config.numAttrs = 1;
      err = cudaLaunchKernelEx(&config, RoutePlanGridKernel<kPer>, a, chunk);
    }
  }
  return err;
}

}  // namespace

int64_t RoutePlanGridScratchInts(int E) {
  return kHeaderInts + static_cast<int64_t>(E) + static_cast<int64_t>(E) * CapacityFor(E);
}

bool RoutePlanGridFits(int n, int K, int E) {
  if (n < 1 || K < 1 || K > 32 || K > E || E > kRoutePlanGridMaxExperts) return false;
  return static_cast<int64_t>(n) <= static_cast<int64_t>(kRoutePlanGridBlockTokens) * std::min(CapacityFor(E), GridCap());
}

cudaError_t LaunchRoutePlanGrid(const RoutePlanGridArgs& a, cudaStream_t stream) {
  const DeviceMoePlanArgs& p = a.plan;
  if (!RoutePlanGridFits(p.n, p.K, p.E) || p.logits == nullptr || p.experts == nullptr || p.experts != p.experts_out ||
      p.weights_out == nullptr || p.table == nullptr || p.units == nullptr || p.num_units == nullptr ||
      p.slot == nullptr || p.error == nullptr || (p.shared.gate != nullptr && p.shared_units == nullptr) ||
      a.scratch == nullptr) {
    return cudaErrorInvalidValue;
  }
  const DevicePrefillTilesArgs& t = a.tiles;
  if (t.tiles != nullptr && (t.tile_rows < 1 || t.max_tiles < 1 || t.num_tiles == nullptr || t.index == nullptr ||
                             t.max_units < 1 || t.max_slots < 1 || t.max_input_rows < 1 || t.gate_up_align < 1 ||
                             t.down_align < 1)) {
    return cudaErrorInvalidValue;
  }
  const int capacity = CapacityFor(p.E);
  const int chunk = ChunkTokens(p.n, std::min(capacity, GridCap()));
  const int G = (p.n + chunk - 1) / chunk;
  if (a.scratch_ints < kHeaderInts + static_cast<int64_t>(p.E) * (1 + G)) return cudaErrorInvalidValue;
  if (p.E <= 128) return Launch<4>(a, G, chunk, stream);
  if (p.E <= 256) return Launch<8>(a, G, chunk, stream);
  return Launch<16>(a, G, chunk, stream);
}

}  // namespace tandem::cuda
