// Matrix-vector kernels that dequantize weights on the fly (decode path), f32 activations and f32
// accumulation (the exact mode). Dense launches of Q8_0, Q4_K, Q5_K and Q6_K run the fast kernel
// of ../matvec_core.cuh; Q4_K expert units run expert_decode.cuh's kernel; the other types a
// generic one (matvec_impl.cuh). Launchers return cudaError_t: cudaErrorInvalidValue for a type
// the kernels cannot read, a shape they refuse (cols not a multiple of 32, or one activation row
// too wide for shared memory) or a misaligned matrix; otherwise the launch error.
//
// Shapes follow ggml: a matrix {cols, rows} has `rows` output rows of `cols` inputs.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MATVEC_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MATVEC_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/moe/expert_unit.h"

namespace tandem::cuda {

// y (n × rows) = W·x for n rows of x (n × cols), W of ggml type `type` at device address w.
cudaError_t LaunchDenseMatVec(uint32_t type, const void* w, int cols, int rows, const float* x,
                              int n, float* y, cudaStream_t stream);

// For every unit u (device array of num_units) and row r < u.rows:
//   act[u.first_slot + r] (inner wide) = SiLU(gate_u·x[u.input_row[r]]) ⊙ up_u·x[u.input_row[r]]
// gate and up share `type`; x is n × h (rows addressed by input_row). max_rows bounds u.rows.
// device_num_units (optional, for CUDA-graph capture): the grid still covers num_units units, but
// the blocks of units at index >= *device_num_units (read on the device when the kernel runs)
// return at once, leaving those units' outputs untouched. It must not exceed num_units' array.
cudaError_t LaunchExpertGateUp(uint32_t type, const ExpertUnit* units, int num_units, int max_rows,
                               int h, int inner, const float* x, float* act, cudaStream_t stream,
                               const int* device_num_units = nullptr);

// For every unit u and row r < u.rows: partial[u.first_slot + r] (h wide) = down_u·act[u.first_slot + r].
// device_num_units as for LaunchExpertGateUp.
cudaError_t LaunchExpertDown(uint32_t type, const ExpertUnit* units, int num_units, int max_rows,
                             int inner, int h, const float* act, float* partial, cudaStream_t stream,
                             const int* device_num_units = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MATVEC_CUH_
