// Decode attention in one launch: the query norm and RoPE, the key norm and RoPE with the K/V append
// into the paged cache, the split-KV attention and the merge of its slices, all in the blocks of
// one grid, for steps whose sequences each have one row item (decode and short drafts). It replaces
// QueryNormRope + KvAppend (two launches, one on the side stream, and a join) + SplitAttention +
// SplitMerge (attention.cuh) on the decode path: four kernel boundaries of the batch-1 chain fewer.
//
// Every block of (row item, kv head, slice) computes its item's query rows for its kv head itself
// (a warp a row, the bits of LaunchQueryNormRope), and the block whose slice holds a new token's
// position computes that token's key and value rows (the bits of LaunchKvAppend), writes them to
// the cache and feeds them to its ring from shared memory instead of the cache. The attention is
// attention_split.cuh's block (SplitAttendBlock), with the slices merged by the last block to
// finish (MergeSlicesIfLast). So the cache rows and o are bit-identical to the unfused path with
// the in-block merge (and to the merge launch, which has the same bits).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_DECODE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_DECODE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/kernels/attention.cuh"

namespace tandem::cuda {

// Whether LaunchDecodeAttention takes this plan and shape: only row items (no tensor-core tiles),
// each sequence's tokens in one item (plan.one_item_per_sequence), hd 64, 128 or 256, nh / kvh
// dividing 8, an even rot <= hd, and at most one ticket counter per (item, kv head) in the scratch.
bool DecodeAttentionFits(const AttentionPlan& plan, const AttnShape& d);

// o for the step's tokens as LaunchAttention computes it, and the step's keys and values appended
// to the cache as LaunchKvAppend does, from the raw rows of the q, k and v products (rows: q and
// gate per head, k and v; the strides as in LaunchQkvNormRopeAppend). The tokens of an item have
// consecutive positions (a sequence's new tokens). scratch: as for LaunchAttention (at least
// plan.scratch_bytes, zeroed once when allocated). cudaErrorInvalidValue when !DecodeAttentionFits.
cudaError_t LaunchDecodeAttention(const QkvRows& rows, int64_t n, const AttnShape& d, const float* q_norm,
                                  const float* k_norm, const double* inv_freq, const AttentionPlan& plan,
                                  const int32_t* items, const int32_t* token_seq, const int32_t* token_pos,
                                  const PagedKv& cache, float* o, void* scratch, cudaStream_t stream);

// Whether the backend's decode steps use LaunchDecodeAttention where it fits
// (TANDEM_ATTN_DECODE_FUSED=1; read once; settable for tests and benchmarks; read when a step is
// enqueued, so a captured decode graph keeps the path it was captured with). Off by default: on
// the H200 (2026-12-02, q3n-80b decode at batch 1, four rounds) 377.6 tok/s against 392.6 for the
// launches it replaces, and no faster alone in attention_bench (docs/PERF.md, Seventeenth session).
bool AttnDecodeFused();
void SetAttnDecodeFused(bool on);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_DECODE_CUH_
