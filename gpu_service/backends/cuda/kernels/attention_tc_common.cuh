// Device pieces shared by the tensor-core prefill attention kernels (attention_tc.cu: the mma.sync
// kernel and the slice merge; attention_tc_wgmma.cu: the wgmma kernel): the cp.async copy with
// zero fill, the key-tile slices of an item, which the kernels and the merge must compute alike,
// the query rows of a block row, and the online-softmax step on a score tile, the accumulators'
// rescale and the epilogue (partials or gated output), which keep the two kernels' outputs bit for
// bit equal. Device code only; internal to the kernels folder.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_COMMON_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_COMMON_CUH_

#include <cmath>
#include <cstdint>

#include "gpu_service/backends/cuda/kernels/attention_tc.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"

namespace tandem::cuda::attn_tc {

// Keys per K/V tile: one cache page.
inline constexpr int kTileKeys = kKvPageSize;

// 16 bytes global -> shared, bypassing L1; zeros instead when !valid (nothing is read).
__device__ __forceinline__ void CpAsync16OrZero(uint32_t dst, const float* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// The key tiles of an item ending at max_pos cut into at most `splits` slices of `per` tiles;
// `used` of them are non-empty. The kernels and the merge compute it alike from the positions.
struct TcSlices {
  int tiles, per, used;
};
__device__ __forceinline__ TcSlices SlicesOf(int32_t max_pos, int splits) {
  const int tiles = max_pos / kTileKeys + 1;
  const int per = (tiles + splits - 1) / splits;
  return TcSlices{tiles, per, (tiles + per - 1) / per};
}

// What block blockIdx.x of a kernel's grid (tile items × kv heads × slices) works on. A
// sequence's items come in increasing position order: walking the grid backwards starts the
// blocks with the most key tiles first (shorter ones fill the tail), kv heads side by side, and an
// item's slices side by side (slice = linear / kvh % splits). Its key tiles are kt_begin ..
// kt_end - 1; none (kt_begin >= kt_end) for a short item's trailing slices.
struct TcBlock {
  int item, kvhead, slice, groups;
  int32_t first, count, min_pos, max_pos;  // the item's first token, its tokens, their first and last position
  const int32_t* pages;                    // the item's sequence's page table row
  TcSlices sl;
  int kt_begin, kt_end;
};
__device__ __forceinline__ TcBlock BlockOf(int nh, int kvh, int splits, const int32_t* items,
                                           const int32_t* token_seq, const int32_t* token_pos, const PagedKv& cache) {
  TcBlock b;
  const int linear = gridDim.x - 1 - blockIdx.x;
  b.item = linear / (kvh * splits);
  b.kvhead = linear % kvh;
  b.slice = linear / kvh % splits;
  b.groups = nh / kvh;
  b.first = items[2 * b.item];
  b.count = items[2 * b.item + 1];
  b.min_pos = token_pos[b.first];
  b.max_pos = token_pos[b.first + b.count - 1];
  b.pages = cache.page_table + static_cast<int64_t>(token_seq[b.first]) * cache.max_pages;
  b.sl = SlicesOf(b.max_pos, splits);
  b.kt_begin = b.slice * b.sl.per;
  b.kt_end = min(b.sl.tiles, b.kt_begin + b.sl.per);
  return b;
}

// Row r of a tile item's kTcRows (token first + tok, tok = r / groups; head kvhead·groups + r % groups):
// its index among the (token, head) rows of q, o and the gate halves of qg. tok comes from the
// caller, which has it already: recomputed here, the compiler reassociates the sum differently and
// the SASS changes (same value, but the callers' code is kept instruction for instruction).
__device__ __forceinline__ int64_t QueryRow(int32_t first, int tok, int r, int groups, int nh, int kvhead) {
  return static_cast<int64_t>(first + tok) * nh + kvhead * groups + r % groups;
}

// The gated output of one dim: the attention value y, already times 1/l, times σ(gate), i.e.
// a · (1/l) · σ(gate) in that order. The caller multiplies by 1/l: with a and 1/l passed in, the
// compiler places the reciprocal elsewhere and the SASS changes.
__device__ __forceinline__ float GatedOutput(float y, float gate) { return y * SigmoidF(gate); }

// One key tile's online-softmax step in base 2 for the thread's two query rows (g and g + 8 of
// its warp's 16), on the scores it holds in the m16n8 accumulator layout: n8 block nb (keys
// key0 + 8nb ..) in s[4nb + c], c < 2 on row g and c >= 2 on row g + 8, columns 2·t4 + (c & 1).
// Scales the scores by scale_log2 and, where `mask`, sets keys past the row's position (pos_lo,
// pos_hi) to −inf; takes the rows' new maxima over the quad (m), replaces each score by
// p = 2^(s − m) and adds the tile's sums to l; corr is the factor the rows' output accumulators
// must be scaled by (1 while a row has seen no key).
template <int kKeys>
__device__ __forceinline__ void OnlineSoftmaxTile(float (&s)[kKeys / 2], float (&m)[2], float (&l)[2],
                                                  float (&corr)[2], float scale_log2, bool mask, int key0, int t4,
                                                  int pos_lo, int pos_hi) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int nb = 0; nb < kKeys / 8; ++nb) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float v = s[4 * nb + c] * scale_log2;
      if (mask && key0 + nb * 8 + 2 * t4 + (c & 1) > (c < 2 ? pos_lo : pos_hi)) v = -INFINITY;
      s[4 * nb + c] = v;
      mx[c >> 1] = fmaxf(mx[c >> 1], v);
    }
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 2));
    corr[i] = mx[i] == -INFINITY ? 1.0f : exp2f(m[i] - mx[i]);
    m[i] = mx[i];
  }
#pragma unroll
  for (int nb = 0; nb < kKeys / 8; ++nb) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float mm = m[c >> 1];
      const float p = mm == -INFINITY ? 0.0f : exp2f(s[4 * nb + c] - mm);
      s[4 * nb + c] = p;
      sum[c >> 1] += p;
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) l[i] = l[i] * corr[i] + sum[i];
}

// The kernels' output accumulators (kHd / 8 n8 blocks in the m16n8 layout) through an accessor:
// acc(nd, c) is the float of n8 block nd (dims 8nd + 2·t4 + (c & 1)) on row g for c < 2, row g + 8
// for c >= 2 (the mma.sync kernel holds them as acc[nd][c], the wgmma kernel as acc[4nd + c]).

// Scales the accumulators of the thread's two rows by OnlineSoftmaxTile's corr.
template <int kHd, typename Acc>
__device__ __forceinline__ void RescaleRows(Acc acc, const float (&corr)[2]) {
#pragma unroll
  for (int nd = 0; nd < kHd / 8; ++nd) {
    acc(nd, 0) *= corr[0];
    acc(nd, 1) *= corr[0];
    acc(nd, 2) *= corr[1];
    acc(nd, 3) *= corr[1];
  }
}

// The end of block b for the thread's rows row0 and row0 + 8 of its item's kTcRows, where they
// hold a token (< b.count): the row sums l over the quad, then, where the item's keys span several
// slices (b.sl.used > 1), the unnormalised rows and their (max, sum) pair into slot (item, kvhead,
// slice, row) of part_o and part_ml for the merge, else o = acc · (1/l) · σ(gate) (the gate half
// of the row's qg) into the row of o.
template <int kHd, typename Acc>
__device__ __forceinline__ void StoreRows(Acc acc, const float (&m)[2], const float (&l)[2], int row0, int t4,
                                          const TcBlock& b, int nh, int kvh, int splits, const float* qg, float* o,
                                          float* part_o, float* part_ml) {
  const int item = b.item, kvhead = b.kvhead, slice = b.slice, groups = b.groups;
  const int32_t first = b.first, count = b.count;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float ll = l[i] + __shfl_xor_sync(0xFFFFFFFFu, l[i], 1);
    ll += __shfl_xor_sync(0xFFFFFFFFu, ll, 2);
    const int r = row0 + 8 * i, tok = r / groups;
    if (tok >= count) continue;
    if (b.sl.used > 1) {
      // A slice of several: the unnormalised rows, their max (base 2, scaled) and sum, for the merge.
      const int64_t slot = ((static_cast<int64_t>(item) * kvh + kvhead) * splits + slice) * kTcRows + r;
#pragma unroll
      for (int nd = 0; nd < kHd / 8; ++nd) {
        *reinterpret_cast<float2*>(part_o + slot * kHd + nd * 8 + 2 * t4) =
            make_float2(acc(nd, 2 * i), acc(nd, 2 * i + 1));
      }
      if (t4 == 0) *reinterpret_cast<float2*>(part_ml + 2 * slot) = make_float2(m[i], ll);
      continue;
    }
    const int64_t row = QueryRow(first, tok, r, groups, nh, kvhead);
    const float inv = 1.0f / ll;
    const float* gate = qg + row * 2 * kHd + kHd;
#pragma unroll
    for (int nd = 0; nd < kHd / 8; ++nd) {
      const int d = nd * 8 + 2 * t4;
      const float2 y = make_float2(GatedOutput(acc(nd, 2 * i) * inv, gate[d]),
                                   GatedOutput(acc(nd, 2 * i + 1) * inv, gate[d + 1]));
      *reinterpret_cast<float2*>(o + row * kHd + d) = y;
    }
  }
}

}  // namespace tandem::cuda::attn_tc

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_COMMON_CUH_
