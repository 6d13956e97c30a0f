// Routing, the MoE step's plan and the prefill runner's tiles in one grid-wide kernel
// (route_plan_grid.cu), for prefill steps planned on the device. Written blind on 2026-12-01
// (branch h/plan2), measured the same day on the H200 (moe/PERF_NOTES.md "Grid-wide prefill
// plan"): route + plan + tiles 31.3 -> 18.6 us at 512 tokens, 77.1 -> 20.8 at 2048, 284.9 -> 37.7
// at 8192; prefill logits bit-identical to the old kernels'.
//
// Why: the route-and-plan kernel (route_plan.cuh) routes over many blocks but the LAST block plans
// every (token, expert) pair alone, and BuildPrefillTilesKernel (prefill_tiles_device.cuh) then
// builds the tiles from the units in ONE block: 24 + 12 us a layer at 512 tokens, ~380 us at 8192
// (H200, 2026-12-01). Here every block routes a contiguous range of tokens and ranks its own
// pairs; two grid-wide barriers (the grid is sized to be co-resident and launched cooperatively)
// separate a per-expert column scan of the per-block counts (spread over the blocks) from the
// placement, which every block does for its own pairs (slot, unit row, slot -> input row index)
// and for its share of the experts (unit headers, tiles).
//
// The outputs. Units (count, order, headers), tiles (count, order, contents), the unit and tile
// counts and the error flag are those of route_plan.cu + prefill_tiles_device.cu. Within an
// expert the pairs come in pair order (token, then pick), as the host planner (PlanMoeStep) orders
// them; the old block plan orders them by the arrival of shared-memory atomics, which varies from
// run to run. Only which token sits at which of an expert's slots differs, and every expert row is
// computed on its own and read back by the scatter-sum through slot[], so the logits are the same
// bits (the backend test compares them).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_PLAN_GRID_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_PLAN_GRID_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/moe/device_plan.cuh"
#include "gpu_service/backends/cuda/moe/prefill_tiles_device.cuh"

namespace tandem::cuda {

// Most experts the grid plan handles (per-block masks and scans in shared memory), and most
// tokens one of its blocks routes (kRoutePlanGridBlockTokens / 64 mask words per expert).
inline constexpr int kRoutePlanGridMaxExperts = 512;
inline constexpr int kRoutePlanGridBlockTokens = 128;

struct RoutePlanGridArgs {
  // As for LaunchRoutePlan (route_plan.cuh): plan.logits, plan.experts == plan.experts_out,
  // plan.weights_out, table, units (room for MaxPlanUnits), num_units, slot, error, optional shared.
  DeviceMoePlanArgs plan;
  // The prefill runner's tile target (ExpertPrefillRunner::DeviceTilesTarget): tile_rows,
  // max_slots, max_input_rows, alignments, tiles, max_tiles, num_tiles, index, max_units (its
  // units, num_units and scratch are not used). tiles == nullptr: units and slots only (the f32
  // path, which runs from the units).
  DevicePrefillTilesArgs tiles;
  // Device scratch of RoutePlanGridScratchInts(E) ints, zeroed once before the first launch (the
  // barrier words are left as they must be found). One per stream: launches sharing it must not
  // run concurrently.
  int* scratch = nullptr;
  int64_t scratch_ints = 0;
};

// Scratch ints a launch for E experts needs on the current device (per-block counts for the
// largest co-resident grid, per-expert totals, barrier words).
int64_t RoutePlanGridScratchInts(int E);

// Whether a step of n tokens, K picks over E experts fits the grid plan on the current device
// (E <= kRoutePlanGridMaxExperts, K <= 32, n <= kRoutePlanGridBlockTokens x the co-resident grid).
bool RoutePlanGridFits(int n, int K, int E);

// cudaErrorInvalidValue where RoutePlanGridFits is false or a required pointer is null; else the
// launch's error (a cooperative launch: cudaErrorCooperativeLaunchTooLarge if the grid could not be
// co-resident).
cudaError_t LaunchRoutePlanGrid(const RoutePlanGridArgs& args, cudaStream_t stream);

// Process-wide A/B switch: prefill steps planned on the device use this kernel (on by default)
// or the route-and-plan kernel and BuildPrefillTilesKernel. TANDEM_OLD_PREFILL_PLAN on at start-up
// (env_switch.h) turns it off.
inline std::atomic<bool>& RoutePlanGridSwitch() {
  static std::atomic<bool> on{!EnvSwitch("TANDEM_OLD_PREFILL_PLAN")};
  return on;
}
inline void SetRoutePlanGrid(bool on) { RoutePlanGridSwitch().store(on, std::memory_order_relaxed); }
inline bool RoutePlanGridOn() { return RoutePlanGridSwitch().load(std::memory_order_relaxed); }

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTE_PLAN_GRID_CUH_
