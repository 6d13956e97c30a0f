// The Q4_K tile kernel of the routed-expert decode path (expert_decode.cuh routes Q4_K units here
// by default). Internal to moe/: expert_decode.cu is its only caller.
//
// Geometry. A lane owns one whole 144-byte super-block (256 elements) of an output row, so a row
// of `cols` inputs takes nsb = cols / 256 lanes and a warp step covers 32 / nsb rows (h 2048:
// 8 lanes per row, 4 rows per step; I 512: 2 lanes, 16 rows). Each warp first copies the raw bytes
// of all its rows (gate and up together in the fused kernel) into shared memory with 16-byte
// cp.async, coalesced (a warp's copy instruction covers 512 contiguous bytes), then decodes from
// shared memory: at a 144-byte stride, 8 consecutive lanes' 16-byte reads hit distinct banks.
// The block stages the unit's activation rows once in shared memory, each 256-element super-block
// padded by 4 floats so that the 8 super-blocks a quarter-warp reads sit in distinct banks.
//
// Decode. A nibble q becomes v = 0.5 + q / 32 with one byte permute into the bits of a float (its
// mantissa gets q << 19), so Σ q·x = 32·Σ v·x − 16·Σ x: per sub-block of 32 elements the kernel
// needs Σ x, computed once per block in shared memory, and the weight scale d·sc and min dmin·m
// enter once per sub-block instead of once per element.
//
// Host-compiler safe (no device code).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_Q4K_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_Q4K_CUH_

#include <cuda_runtime.h>

#include "gpu_service/backends/cuda/moe/expert_unit.h"

namespace tandem::cuda {

// True when the tile kernel takes rows of `cols` Q4_K inputs: cols a multiple of 256 with at most
// 32 super-blocks (one lane each).
bool Q4KTilesFit(int cols);

// The fused gate/up + SiLU kernel (fused) or the down kernel over Q4_K units, contracts of
// LaunchExpertDecodeGateUp / LaunchExpertDecodeDown (cols = h, out_rows = inner for gate/up; cols
// = inner, out_rows = h for down). steps_per_warp: warp steps each warp walks, at most 4 (0: the
// default, 1; a count whose shared memory would not fit is cut). warps: warps per block, 2, 4 or 8,
// or 0 for the rule (4 for launches of about one wave, 8 above). Launched through LaunchPdl.
cudaError_t LaunchQ4KTiles(bool fused, const ExpertUnit* units, int num_units, int max_rows, int cols, int out_rows,
                           const float* in, float* out, cudaStream_t stream, const int* device_num_units,
                           int steps_per_warp, int warps);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_Q4K_CUH_
