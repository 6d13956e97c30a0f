// The prefill runner's per-call plan made on the device (prefill_tiles_device.cu): from a device
// list of ExpertUnits and its device count (the route-and-plan kernel's output, route_plan.cuh),
// the row tiles of the grouped launches, their count and the slot -> input row index, exactly as
// the host path builds them (GroupUnits, MakePrefillTiles and the index loop of
// ExpertPrefillRunner::RunGrouped), so that a prefill step needs no host round trip per MoE layer.
//
// Why on the device: the host path copied the units back and waited for the stream once per MoE
// layer (48 times a step on the 80B model), so the GPU drained and idled during the copy, the
// host planning and the relaunch.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_PREFILL_TILES_DEVICE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_PREFILL_TILES_DEVICE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_unit.h"

namespace tandem::cuda {

struct DevicePrefillTilesArgs {
  const ExpertUnit* units = nullptr;  // device, *num_units of them
  const int* num_units = nullptr;     // device
  int max_units = 0;                  // bound on *num_units (a larger count is an error)
  int tile_rows = 0;                  // rows per tile: a group of r rows gives ceil(r / tile_rows) tiles
  // The checks RunGrouped makes on host units: rows in [1, kMaxUnitRows], first_slot >= 0, slots
  // below max_slots, input rows in [0, max_input_rows), matrices non-null and aligned.
  int max_slots = 0;
  int max_input_rows = 0;
  int gate_up_align = 1, down_align = 1;  // bytes
  // Outputs: the tiles (room for max_tiles), their count, index[slot] = input row of the slot (only
  // the slots some unit covers are written).
  PrefillTile* tiles = nullptr;
  int max_tiles = 0;
  int* num_tiles = nullptr;
  int32_t* index = nullptr;
  // Scratch of 3 · max_units ints (device).
  int* scratch = nullptr;
  // Set to 1 (never cleared here) for a unit failing the checks, a count outside [0, max_units] or
  // tiles beyond max_tiles; *num_tiles is then 0 (the call computes nothing).
  int* error = nullptr;
};

// One block. cudaErrorInvalidValue for a null pointer, tile_rows < 1 or a non-positive bound.
cudaError_t LaunchBuildPrefillTiles(const DevicePrefillTilesArgs& args, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_PREFILL_TILES_DEVICE_CUH_
