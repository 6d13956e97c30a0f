// Attention restricted to the indexer's selected blocks (docs/MODEL.md §4.5 steps 4-6): for each
// token, softmax(⟨q_h, k_j⟩/√hd)·V over the positions j of the blocks the indexer selected plus
// the query's own block up to its position, times σ(gate). Reads the paged KV cache of
// kernels/attention.cuh and the selection format of moe/indexer.cuh. f32 throughout (online
// softmax); one warp per (token, head).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_SPARSE_ATTENTION_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_SPARSE_ATTENTION_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

struct SparseAttnArgs {
  const float* q = nullptr;        // n × nh × hd (normed, roped)
  const float* qg = nullptr;       // n × nh × 2hd (gate: the second hd of each head)
  int64_t n = 0;
  int nh = 0, kvh = 0, hd = 0;
  const int32_t* token_seq = nullptr;  // per token: page-table row
  const int32_t* token_pos = nullptr;  // per token: position
  const float* k_cache = nullptr;      // pages × 64 × kvh·hd
  const float* v_cache = nullptr;
  const int32_t* page_table = nullptr;
  int max_pages = 0;
  const int32_t* blocks = nullptr;     // per token: max_selected block ids (ascending)
  const int32_t* counts = nullptr;     // per token: how many
  int max_selected = 0;                // keep + 1
  int cr = 0;                          // positions per block
  float* o = nullptr;                  // n × nh × hd
};

// hd must be a multiple of 32 and at most 256; nh a multiple of kvh. cudaErrorInvalidValue else.
cudaError_t LaunchSparseAttention(const SparseAttnArgs& a, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_SPARSE_ATTENTION_CUH_
