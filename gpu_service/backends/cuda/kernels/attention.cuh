// Gated full attention on the GPU (docs/MODEL.md §4.5, dense form): q/k RMS norm with partial NeoX
// RoPE, K/V append into a paged cache, and flash-style attention with the σ(gate) output gate
// for decode and prefill alike. The projections (attn_q/k/v, attn_output) are dense products.
//
// The paged cache: K and V pools of f32, page p holding positions [64·i, 64·i + 64) of whichever
// sequence maps logical page i to p; position j of that page at (p·64 + j)·kv_width. A sequence's
// page table is a row of `page_table` (row stride max_pages). Per token of a step the caller gives
// the sequence's page-table row (token_seq) and the position (token_pos); the tokens of one
// sequence are consecutive in the step and in increasing position.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace tandem::cuda {

inline constexpr int kKvPageSize = 64;

struct AttnShape {
  int nh = 0, kvh = 0, hd = 0, rot = 0;
  float eps = 1e-6f;
  int kv_width() const { return kvh * hd; }
};

struct PagedKv {
  float* k = nullptr;                 // pages × 64 × kv_width
  float* v = nullptr;                 // pages × 64 × kv_width
  const int32_t* page_table = nullptr;  // sequences × max_pages physical page ids
  int max_pages = 0;
};

// The RoPE inverse frequencies θ^(−2i/rot), i < rot/2, computed in f64 on the host exactly as the
// CPU reference does; upload them once per model.
std::vector<double> RopeInvFrequencies(double theta, int rot);

// Queries: for every token t and head h, q_out[t][h] = RoPE_pos(q_norm ⊙ ρ(qg[t][h][0:hd])), with
// qg laid out n × nh × 2hd (per head hd query values then hd gate values, as attn_q writes them).
// inv_freq holds rot/2 doubles in device memory. hd <= 1024.
cudaError_t LaunchQueryNormRope(const float* qg, int64_t n, const AttnShape& d, const float* q_norm,
                                const double* inv_freq, const int32_t* token_pos, float* q_out,
                                cudaStream_t stream);

// Keys and values: k (n × kvh·hd, raw projection) is normed with k_norm and roped at the token's
// position, then stored with v (n × kvh·hd) into the token's page of the cache.
cudaError_t LaunchKvAppend(const float* k, const float* v, int64_t n, const AttnShape& d,
                           const float* k_norm, const double* inv_freq, const int32_t* token_seq,
                           const int32_t* token_pos, const PagedKv& cache, cudaStream_t stream);

// The work items of one step: each item is (first token, token count) with all its tokens in one
// sequence and at most 8 / groups tokens (groups = nh / kvh, which must divide 8). Computed on the
// host from the per-token sequence ids (the FlashInfer-style plan); upload it as int32 pairs.
std::vector<int32_t> PlanAttentionItems(const std::vector<int32_t>& token_seq, int groups);

// o[t][h] = softmax_j(⟨q[t][h], K_j⟩/√hd)·V_j over positions j <= token_pos[t] of the token's
// sequence (kv head h / groups), times σ(gate) taken from qg (n × nh × 2hd). items holds
// num_items (first token, count) pairs from PlanAttentionItems. hd must be 64, 128 or 256.
cudaError_t LaunchAttention(const float* q, const float* qg, int64_t n, const AttnShape& d,
                            const int32_t* items, int num_items, const int32_t* token_seq,
                            const int32_t* token_pos, const PagedKv& cache, float* o,
                            cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_CUH_
