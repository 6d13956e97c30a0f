// The tensor-core prefill attention of attention.cuh (AttentionPrecision::kF16TensorCores), as
// its own compilation unit: the tile items of an AttentionPlan. Internal to the kernels folder.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpu_service/backends/cuda/kernels/attention.cuh"

namespace tandem::cuda {

// Query rows of one tile item (tokens × heads of one kv head): PlanAttention cuts tile items to
// kTcRows / groups tokens. 128 rows are the most one SM holds at hd 256 (8 warps × 16 rows, the
// f32 output accumulators alone take half the register file), and every K/V tile loaded serves
// all of them, so the item is as tall as that allows.
inline constexpr int kTcRows = 128;

// Context slices per tile item and kv head at most (AttentionPlan::tc_splits).
inline constexpr int kTcMaxSplits = kAttnMaxTcSplits;

// Device scratch for `blocks` = tile items · kv heads · splits slices of head size hd: each
// slice's unnormalised output rows, then their (max, sum) pairs.
inline size_t TensorCoreAttentionPartialBytes(int64_t blocks, int hd) {
  return static_cast<size_t>(blocks) * kTcRows * (hd + 2) * sizeof(float);
}

// Runs num_tile_items (first token, count) items (device) on the tensor cores; d.hd is 64, 128 or
// 256 (else cudaErrorInvalidValue). Same inputs and output as LaunchAttention. With splits > 1
// every item and kv head is cut into `splits` slices of its key tiles (computed on the device from
// the item's last position, so the launch depends on the batch shape only): an item whose keys
// span more than one slice writes per-slice partials to `partials` (at least
// TensorCoreAttentionPartialBytes(num_tile_items · kvh · splits, hd) bytes) and a merge kernel
// combines them; an item that fits one slice writes o directly, as with splits == 1.
cudaError_t LaunchTensorCoreAttention(const float* q, const float* qg, const AttnShape& d, const int32_t* tile_items,
                                      int num_tile_items, const int32_t* token_seq, const int32_t* token_pos,
                                      const PagedKv& cache, float* o, cudaStream_t stream, int splits = 1,
                                      void* partials = nullptr);

// The wgmma kernel of attention_tc_wgmma.cu (hd 256 only; LaunchTensorCoreAttention runs it when
// AttnTcWgmma(), attention.cuh): `blocks` = num_tile_items · kvh · splits blocks over the same
// items, writing o, or with splits > 1 the same partials as the pipelined kernel (part_o, part_ml)
// for the caller's merge launch.
cudaError_t LaunchWgmmaTensorCoreAttention256(const float* q, const float* qg, const AttnShape& d,
                                              const int32_t* tile_items, unsigned blocks, const int32_t* token_seq,
                                              const int32_t* token_pos, const PagedKv& cache, float* o,
                                              cudaStream_t stream, int splits, float* part_o, float* part_ml);

// The same with the f16 tiles (AttnKv16(), attention_kv16.cu): converts the tiles the
// num_tile_items items attend into cache.f16_tiles (one launch), then runs the kernel that copies
// them into shared memory unconverted. Same arguments, items, partials and bits as
// LaunchWgmmaTensorCoreAttention256; cudaErrorInvalidValue without cache.f16_tiles. overlap: the
// kernel that issues S(t + 1) before the softmax of tile t (AttnKv16Mode() == 2), same bits.
cudaError_t LaunchWgmmaKv16Attention256(const float* q, const float* qg, const AttnShape& d,
                                        const int32_t* tile_items, int num_tile_items, unsigned blocks,
                                        const int32_t* token_seq, const int32_t* token_pos, const PagedKv& cache,
                                        float* o, cudaStream_t stream, int splits, float* part_o, float* part_ml,
                                        bool overlap);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_CUH_
