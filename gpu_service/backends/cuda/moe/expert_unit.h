// Plain structs shared by the host planners and the CUDA kernels of the MoE path (nvcc-safe: no
// Abseil, no std containers).
//
// The expert compute path never assumes where an expert lives: every step hands the kernels a
// list of ExpertUnits, each naming the device addresses of one expert's three matrices (resident
// weights today; slots of the expert arena later) and up to kMaxUnitRows activation rows.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_UNIT_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_UNIT_H_

#include <cstdint>

namespace tandem::cuda {

// Rows one decode unit carries; an expert with more rows in a step is split into several units.
inline constexpr int kMaxUnitRows = 8;

// Device addresses of one expert's matrices in ggml order: gate and up {h, I} (I rows of h
// columns), down {I, h} (h rows of I columns), each row stored in the layer's block format.
struct ExpertLocation {
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* down = nullptr;
};

// One expert applied to `rows` activation rows. Row r reads input row input_row[r] of the MoE
// input x (n × h) and owns output slot first_slot + r: the gate/up kernel writes its SiLU(g)·u row
// to act[first_slot + r] (I wide) and the down kernel writes FFN_e(x) to partial[first_slot + r]
// (h wide).
struct ExpertUnit {
  const void* gate;
  const void* up;
  const void* down;
  int32_t rows;
  int32_t first_slot;
  int32_t input_row[kMaxUnitRows];
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_UNIT_H_
