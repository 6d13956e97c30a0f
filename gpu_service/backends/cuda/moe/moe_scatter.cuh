// The MoE scatter-sum (docs/MODEL.md §4.6 step 3):
//   y[t] = Σ_k weights[t·K + k]·partial[slot[t·K + k]] + σ(shared_gate_logit[t])·shared[t]
// summed in f32 in routing order (k ascending, then the shared term) for every token, so the
// result depends only on the partial rows and not on where (GPU kernels, the host worker) or in
// what order they were computed. partial rows are h wide; rows computed off the GPU are copied
// into their slots before the launch.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MOE_SCATTER_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MOE_SCATTER_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// shared (n × h) may be nullptr (no shared expert); shared_gate_logit (n) may be nullptr (the
// shared expert is added ungated). All pointers are device pointers.
cudaError_t LaunchMoeScatterSum(const float* partial, const int32_t* slot, const float* weights, int n, int K,
                                int h, const float* shared, const float* shared_gate_logit, float* y,
                                cudaStream_t stream);

// LaunchMoeScatterSum runs a vector kernel (four columns per thread, a token's partial rows
// loaded together) when h is a multiple of 4 and partial, shared and y are 16-byte aligned, else
// the per-element kernel; both give the same bits. (Its A/B switch with the MoE stage's other
// pre-glue paths, TANDEM_OLD_MOE_GLUE, was removed in the ninth session, 2026-12-01.)

// The per-element kernel alone, any h (the baseline for tests and benchmarks).
cudaError_t LaunchMoeScatterSumPerElement(const float* partial, const int32_t* slot, const float* weights, int n,
                                          int K, int h, const float* shared, const float* shared_gate_logit, float* y,
                                          cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MOE_SCATTER_CUH_
