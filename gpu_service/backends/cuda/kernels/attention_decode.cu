#include "gpu_service/backends/cuda/kernels/attention_decode.cuh"

#include <atomic>
#include <cmath>

#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/attention_merge.cuh"
#include "gpu_service/backends/cuda/kernels/attention_split.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/norm_rope_warp.cuh"
#include "gpu_service/backends/cuda/kernels/paged_kv.cuh"
#include "gpu_service/backends/cuda/kernels/rope_f64.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

// Shared memory after SplitAttendBlock's: the item's kRows query rows, then per new token of the
// item (at most kRows) its key and value rows.
template <int kHd>
constexpr size_t DecodeSmemBytes() {
  return SplitSmemBytes<kHd>() + sizeof(float) * (kRows + 2 * kRows) * kHd;
}

// One head of one token normed and roped by one warp (norm_rope_warp.cuh), the rotation's f64 sine
// and cosine computed here from freq[j] (the frequency of value 32j + l when it is below rot) at pos.
template <int kJ>
__device__ __forceinline__ void WarpNormRopeRow(const float (&x)[kJ], const float (&gamma)[kJ],
                                                const double (&freq)[kJ], int hd, float eps, int rot, int64_t pos,
                                                float* row) {
  WarpNormRopeRowWith<kJ>(x, gamma, hd, eps, rot, row, [&](int, int j, double* s, double* c) {
    sincos(static_cast<double>(pos) * freq[j], s, c);
  });
}

// Grid (row items, kv heads, slices) of kSplitWarps warps, as SplitAttentionKernel's; kMergeHere
// when the plan has slices (the last block of each (item, kv head) merges them).
template <int kHd, bool kMergeHere>
__global__ void __launch_bounds__(kSplitWarps * 32, 1)
DecodeAttentionKernel(QkvRows rows, int nh, int kvh, int rot, float eps, const float* __restrict__ q_norm,
                      const float* __restrict__ k_norm, const double* __restrict__ inv_freq,
                      const int32_t* __restrict__ items, const int32_t* __restrict__ token_seq,
                      const int32_t* __restrict__ token_pos, PagedKv cache, float* __restrict__ part_o,
                      float* __restrict__ part_ml, float* __restrict__ o, unsigned* __restrict__ tickets,
                      int short_keys) {
  constexpr int kJ = kHd / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // The norms' weights and the rotation's frequencies: no kernel of the step writes them.
  const int half = rot / 2;
  float gq[kJ], gk[kJ];
  double freq[kJ];
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    const int i = 32 * j + lane;
    gq[j] = q_norm[i];
    gk[j] = k_norm[i];
    freq[j] = i < rot ? inv_freq[i < half ? i : i - half] : 0.0;
  }
  extern __shared__ float4 split_smem[];
  float* qs = reinterpret_cast<float*>(split_smem) + SplitSmemBytes<kHd>() / sizeof(float);  // kRows × kHd
  float* fresh_kv = qs + kRows * kHd;                                                       // tokens × 2kHd
  auto prep = [&](int32_t first, int32_t count, int32_t seq, int64_t begin, int64_t end) {
    const int groups = nh / kvh, kvhead = blockIdx.y, kvw = kvh * kHd;
    const int64_t from = token_pos[first];  // the item's new tokens hold positions from .. from + count - 1
    // Query row `warp`: head kvhead·groups + warp % groups of token warp / groups.
    if (warp / groups < count) {
      const int tok = warp / groups;
      const float* src = rows.qg + (first + tok) * rows.qg_stride +
                         static_cast<int64_t>(kvhead * groups + warp % groups) * 2 * kHd + lane;
      float x[kJ];
#pragma unroll
      for (int j = 0; j < kJ; ++j) x[j] = src[32 * j];
      WarpNormRopeRow<kJ>(x, gq, freq, kHd, eps, rot, token_pos[first + tok], qs + warp * kHd);
    }
    // New token t (position from + t), when this slice holds it: its key normed and roped and its
    // value into shared memory and into the cache (no other block of the grid writes that row).
    for (int t = warp; t < count; t += kSplitWarps) {
      const int64_t pos = from + t;
      if (pos < begin || pos >= end) continue;
      const int64_t col = static_cast<int64_t>(kvhead) * kHd + lane;
      const float* ksrc = rows.k + (first + t) * rows.k_stride + col;
      const float* vsrc = rows.v + (first + t) * rows.v_stride + col;
      float x[kJ], v[kJ];
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        x[j] = ksrc[32 * j];
        v[j] = vsrc[32 * j];
      }
      float* krow = fresh_kv + static_cast<int64_t>(t) * 2 * kHd;
      WarpNormRopeRow<kJ>(x, gk, freq, kHd, eps, rot, pos, krow);
      const int64_t dst = CacheOffset(cache, seq, pos, kvw) + col;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        krow[kHd + 32 * j + lane] = v[j];
        cache.k[dst + 32 * j] = krow[32 * j + lane];
        cache.v[dst + 32 * j] = v[j];
      }
    }
    __syncthreads();  // the rows are in shared memory for every warp
    return FreshRows{qs, fresh_kv, from};
  };
  // The block waits for the previous kernel inside, once its cached keys are on their way
  // (early_kv: each sequence's tokens are one item here, DecodeAttentionFits).
  SplitAttendBlock<kHd, kMergeHere, true>(nullptr, rows.qg, rows.qg_stride, nh, kvh, items, token_seq, token_pos,
                                          cache, part_o, part_ml, o, tickets, short_keys, true, prep);
}

template <int kHd>
cudaError_t LaunchDecodeHd(const QkvRows& rows, const AttnShape& d, const float* q_norm, const float* k_norm,
                           const double* inv_freq, const AttentionPlan& plan, const int32_t* items,
                           const int32_t* token_seq, const int32_t* token_pos, const PagedKv& cache, float* o,
                           void* scratch, cudaStream_t stream) {
  constexpr size_t smem = DecodeSmemBytes<kHd>();
  // Above 48 KiB a kernel needs the opt-in; done once per instantiation (thread-safe static).
  static const cudaError_t attribute = cudaFuncSetAttribute(
      DecodeAttentionKernel<kHd, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attribute != cudaSuccess) return attribute;
  static const cudaError_t attribute_merge = cudaFuncSetAttribute(
      DecodeAttentionKernel<kHd, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attribute_merge != cudaSuccess) return attribute_merge;
  const int splits = plan.num_splits;
  const SplitScratch parts = SplitScratchOf(scratch, plan.num_row_items, d.kvh, splits, kHd);
  const int short_keys = splits > 1 && !OldAttnSplit() ? AttnShortKeys() : 0;
  const dim3 grid(static_cast<unsigned>(plan.num_row_items), static_cast<unsigned>(d.kvh),
                  static_cast<unsigned>(splits));
  const int64_t qg_stride = rows.qg_stride == 0 ? static_cast<int64_t>(d.nh) * 2 * kHd : rows.qg_stride;
  const QkvRows strided{rows.qg, qg_stride, rows.k, rows.k_stride == 0 ? d.kv_width() : rows.k_stride,
                        rows.v, rows.v_stride == 0 ? d.kv_width() : rows.v_stride};
  return LaunchPdl(splits > 1 ? DecodeAttentionKernel<kHd, true> : DecodeAttentionKernel<kHd, false>, grid,
                   kSplitWarps * 32, smem, stream, strided, d.nh, d.kvh, d.rot, d.eps, q_norm, k_norm, inv_freq,
                   items, token_seq, token_pos, cache, parts.part_o, parts.part_ml, o, parts.tickets, short_keys);
}

ProcessSwitch g_attn_decode_fused{[] { return EnvSwitch("TANDEM_ATTN_DECODE_FUSED"); }};

}  // namespace

bool DecodeAttentionFits(const AttentionPlan& plan, const AttnShape& d) {
  return plan.one_item_per_sequence && plan.num_tile_items == 0 && plan.num_row_items > 0 && d.kvh > 0 &&
         d.nh > 0 && d.nh % d.kvh == 0 && kRows % (d.nh / d.kvh) == 0 &&
         (d.hd == 64 || d.hd == 128 || d.hd == 256) && d.rot >= 0 && d.rot % 2 == 0 && d.rot <= d.hd &&
         plan.num_splits >= 1 && plan.num_splits <= kMaxSplits &&
         (plan.num_splits == 1 || plan.num_row_items * d.kvh <= kTicketCount);
}

cudaError_t LaunchDecodeAttention(const QkvRows& rows, int64_t n, const AttnShape& d, const float* q_norm,
                                  const float* k_norm, const double* inv_freq, const AttentionPlan& plan,
                                  const int32_t* items, const int32_t* token_seq, const int32_t* token_pos,
                                  const PagedKv& cache, float* o, void* scratch, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!DecodeAttentionFits(plan, d) || (plan.scratch_bytes > 0 && scratch == nullptr) ||
      (rows.qg_stride != 0 && rows.qg_stride < static_cast<int64_t>(d.nh) * 2 * d.hd) ||
      (rows.k_stride != 0 && rows.k_stride < d.kv_width()) || (rows.v_stride != 0 && rows.v_stride < d.kv_width())) {
    return cudaErrorInvalidValue;
  }
  switch (d.hd) {
    case 64:
      return LaunchDecodeHd<64>(rows, d, q_norm, k_norm, inv_freq, plan, items, token_seq, token_pos, cache, o,
                                scratch, stream);
    case 128:
      return LaunchDecodeHd<128>(rows, d, q_norm, k_norm, inv_freq, plan, items, token_seq, token_pos, cache, o,
                                 scratch, stream);
    case 256:
      return LaunchDecodeHd<256>(rows, d, q_norm, k_norm, inv_freq, plan, items, token_seq, token_pos, cache, o,
                                 scratch, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

bool AttnDecodeFused() { return g_attn_decode_fused.on(); }
void SetAttnDecodeFused(bool on) { g_attn_decode_fused.set(on); }

}  // namespace tandem::cuda
