// The prefill tile builder (prefill_tiles_device.cuh): one block of kThreads threads, two passes of
// block scans.
//  1. Units in chunks of kThreads: each checks itself, writes its slots' input rows, and flags
//     whether it starts a group (GroupUnits' rule: another expert, or slots not following the
//     previous unit's). An inclusive scan of the flags numbers the groups; a group's first unit
//     records its index and its last unit the group's end slot (scratch).
//  2. Groups in chunks of kThreads: ceil(rows / tile_rows) tiles each, placed by an exclusive scan
//     (MakePrefillTiles' order: groups in unit order, a group's tiles by rising slot).
// About 10k units at 8192 tokens on the 80B model: a few microseconds, against the host round trip
// it replaces.
#include "gpu_service/backends/cuda/moe/prefill_tiles_device.cuh"

#include <cub/block/block_scan.cuh>

namespace tandem::cuda {
namespace {

constexpr int kThreads = 1024;
using Scan = cub::BlockScan<int, kThreads>;

__device__ __forceinline__ bool Continues(const ExpertUnit& prev, const ExpertUnit& u) {
  return prev.gate == u.gate && prev.up == u.up && prev.down == u.down && prev.first_slot + prev.rows == u.first_slot;
}

__device__ __forceinline__ bool Misaligned(const void* p, int align) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % static_cast<unsigned>(align) != 0;
}

__global__ void __launch_bounds__(kThreads) BuildPrefillTilesKernel(DevicePrefillTilesArgs a) {
  __shared__ typename Scan::TempStorage scan;
  const int tid = static_cast<int>(threadIdx.x);
  const int count = *a.num_units;  // the same for every thread: the loops below are uniform
  if (count < 0 || count > a.max_units) {
    if (tid == 0) {
      *a.error = 1;
      *a.num_tiles = 0;
    }
    return;
  }
  int* group_unit = a.scratch;                // group -> its first unit
  int* group_end = a.scratch + a.max_units;  // group -> one past its last slot
  // 1. Units: checks, the index, group numbers.
  int groups = 0;
  bool bad = false;
  for (int base = 0; base < count; base += kThreads) {
    const int i = base + tid;
    int start = 0;
    bool my_bad = false;
    ExpertUnit u{};
    if (i < count) {
      u = a.units[i];
      my_bad = u.rows < 1 || u.rows > kMaxUnitRows || u.first_slot < 0 || u.first_slot > a.max_slots - u.rows ||
               Misaligned(u.gate, a.gate_up_align) || Misaligned(u.up, a.gate_up_align) ||
               Misaligned(u.down, a.down_align);
      if (!my_bad) {
        for (int r = 0; r < u.rows; ++r) {
          const int row = u.input_row[r];
          if (row < 0 || row >= a.max_input_rows) my_bad = true;
          a.index[u.first_slot + r] = row;
        }
      }
      start = i == 0 || !Continues(a.units[i - 1], u) ? 1 : 0;
    }
    int g = 0, added = 0;
    Scan(scan).InclusiveSum(start, g, added);
    g += groups - 1;
    if (i < count) {
      if (start != 0) group_unit[g] = i;
      if (i == count - 1 || !Continues(u, a.units[i + 1])) group_end[g] = u.first_slot + u.rows;
    }
    groups += added;
    // Also the barrier before the scan storage is reused and before pass 2 reads the scratch.
    bad = __syncthreads_or(my_bad ? 1 : 0) != 0 || bad;
  }
  // 2. Groups: tiles.
  const int T = a.tile_rows;
  int tiles = 0;
  for (int base = 0; base < groups; base += kThreads) {
    const int g = base + tid;
    int first = 0, rows = 0, mine = 0;
    ExpertLocation where;
    if (g < groups) {
      const ExpertUnit& u = a.units[group_unit[g]];
      where = {u.gate, u.up, u.down};
      first = u.first_slot;
      rows = group_end[g] - first;
      mine = (rows + T - 1) / T;
    }
    int offset = 0, added = 0;
    Scan(scan).ExclusiveSum(mine, offset, added);
    offset += tiles;
    if (g < groups && offset + mine <= a.max_tiles) {
      for (int k = 0; k < mine; ++k) {
        a.tiles[offset + k] = PrefillTile{where.gate, where.up, where.down, first + k * T, min(T, rows - k * T)};
      }
    }
    tiles += added;
    __syncthreads();  // the scan storage is reused
  }
  if (tid == 0) {
    if (bad || tiles > a.max_tiles) {
      *a.error = 1;
      *a.num_tiles = 0;
    } else {
      *a.num_tiles = tiles;
    }
  }
}

}  // namespace

cudaError_t LaunchBuildPrefillTiles(const DevicePrefillTilesArgs& a, cudaStream_t stream) {
  if (a.units == nullptr || a.num_units == nullptr || a.max_units < 1 || a.tile_rows < 1 || a.max_slots < 1 ||
      a.max_input_rows < 1 || a.gate_up_align < 1 || a.down_align < 1 || a.tiles == nullptr || a.max_tiles < 1 ||
      a.num_tiles == nullptr || a.index == nullptr || a.scratch == nullptr || a.error == nullptr) {
    return cudaErrorInvalidValue;
  }
  BuildPrefillTilesKernel<<<1, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
