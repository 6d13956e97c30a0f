// The query-selected sparse attention indexer (docs/MODEL.md §4.5 step 4) on the GPU: index
// queries and raw keys, block keys, block scores and the top-keep selection. The attention kernel
// consumes the selection:
//
//   Selection format: for token t (position p = start_pos + t, own block nb = p / cr),
//   blocks[t·(keep + 1) + i] for i < counts[t] lists the attended blocks in ascending order; the
//   last entry is always nb, the query's own (partial) block. Block b covers positions
//   b·cr .. min(b·cr + cr, p + 1) − 1. With nb <= keep every earlier block is listed (dense).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_INDEXER_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_INDEXER_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// iqk: n × (ih·di + di), the rows of attn_idx_qk·x. Writes iq (n × ih·di) with
// iq_j = RoPE_{start_pos + t}(q_norm ⊙ ρ(iq_j)) and the raw index key of position start_pos + t
// to index_keys + (start_pos + t)·di. RoPE angles and norm sums in f64 as in the reference.
cudaError_t LaunchIndexerPrepare(const float* iqk, const float* q_norm, int n, int ih, int di, int rot, double theta,
                                 float eps, int64_t start_pos, float* iq, float* index_keys, cudaStream_t stream);

// Block keys of the complete blocks first_block .. first_block + count − 1:
// K_b = RoPE_{b·cr}(k_norm ⊙ ρ(mean of index_keys over the block's cr positions)), at block_keys + b·di.
cudaError_t LaunchIndexerBlockKeys(const float* index_keys, const float* k_norm, int64_t first_block, int count, int cr,
                                   int di, int rot, double theta, float eps, float* block_keys, cudaStream_t stream);

// scores[t·stride + b] = Σ_j ReLU(⟨iq_j, K_b⟩)/√di for b < nb_t = (start_pos + t)/cr (stride >= the
// largest nb_t); entries from nb_t on are left alone.
cudaError_t LaunchIndexerScores(const float* iq, const float* block_keys, int n, int ih, int di, int64_t start_pos,
                                int cr, float* scores, int stride, cudaStream_t stream);

// The selection (format above): the keep highest scores of the nb_t candidates (ties to the lower
// block, as SelectTopBlocks), or all of them when nb_t <= keep, plus the own block.
cudaError_t LaunchIndexerSelect(const float* scores, int stride, int n, int64_t start_pos, int cr, int keep,
                                int32_t* blocks, int32_t* counts, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_INDEXER_CUH_
