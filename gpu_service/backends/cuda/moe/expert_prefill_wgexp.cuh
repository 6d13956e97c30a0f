// The weights-as-A wgmma Q4_K prefill GEMM (PrefillKernel::kWgmma; expert_prefill_wgexp.cu):
// Hopper warpgroup MMAs with the dequantized weights in registers (the A operand) and the tokens
// as N, for the large expert groups of 8192-token prefills: the reference of the warp-specialized
// default kWgmmaWs (expert_prefill_wgws.cuh, the same bits) and its TANDEM_PREFILL_WGMMA=1
// fallback. Host-callable declarations only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGEXP_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGEXP_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"

namespace tandem::cuda {

// Bound on a kWgmma tile's rows (wgmma N <= 256), and the weight rows of one of its units (two
// warpgroups of m64). N (gate/up: 2·inner interleaved rows, down: h) must be a multiple of the unit.
inline constexpr int kWgmmaMaxTileRows = 256;
inline constexpr int kWgmmaUnitRows = 128;

// The streamed kernel's contract (expert_prefill_stream.cuh: a, a_index, K, N, out_cols, act_out
// for gate/up with N = 2·inner rows interleaved gate/up, f32_out for down), Q4_K weights, tiles of
// at most tile_rows rows. tile_count (device, may be null): the number of tiles, read by the
// kernel; num_tiles is then its bound. cudaErrorInvalidValue unless K % 256 == 0, N % 128 == 0 and
// 1 <= tile_rows <= 256. Launched through LaunchPrefillPdl.
cudaError_t LaunchWgmmaQ4KGemm(bool gate_up, int tile_rows, const PrefillTile* tiles, int num_tiles, const uint16_t* a,
                               const int32_t* a_index, int K, int N, int out_cols, uint16_t* act_out, float* f32_out,
                               cudaStream_t stream, const int* tile_count);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGEXP_CUH_
