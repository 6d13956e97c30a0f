// The warp-specialized weights-as-A wgmma Q4_K prefill GEMM (PrefillKernel::kWgmmaWs;
// expert_prefill_wgws.cu): kWgmma's units, dequantization, wgmmas and epilogue arithmetic, with a
// producer warpgroup that issues every copy and two consumer warpgroups that only dequantize and
// MMA. Host-callable declarations only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGWS_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGWS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"

namespace tandem::cuda {

// LaunchWgmmaQ4KGemm's contract and scope (expert_prefill_wgexp.cuh: Q4_K, K % 256 == 0,
// N % kWgmmaUnitRows == 0, 1 <= tile_rows <= kWgmmaMaxTileRows, else cudaErrorInvalidValue), and
// its results bit for bit (the same f16 operands into the same accumulators in the same k order).
cudaError_t LaunchWgmmaWsQ4KGemm(bool gate_up, int tile_rows, const PrefillTile* tiles, int num_tiles,
                                 const uint16_t* a, const int32_t* a_index, int K, int N, int out_cols,
                                 uint16_t* act_out, float* f32_out, cudaStream_t stream, const int* tile_count);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGWS_CUH_
