// The two ways the exact split-KV attention's context slices are combined (attention.cu): the
// merge kernel (SplitMergeKernel, its own launch: the default) and, with TANDEM_ATTN_MERGE_IN_BLOCK=1
// and TANDEM_ATTN_DECODE_ONE_PREP=1 (attention.cuh), the merge by the last slice block of each (row
// item, kv head) to finish (MergeSlicesIfLast, no launch), which repeats the merge kernel's f32
// operations in the same order: same bits.
// Device-only (hence the unnamed namespace): kernels/attention.cu, and kernels/dense_colsplit.cu for
// the o product that merges a one-token step's slices itself (MergeSliceRow).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_MERGE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_MERGE_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cuda/atomic>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kRows = 8;  // rows of a row item
constexpr int kSplitWarps = 8;
constexpr int kSplitTargetBlocks = 132;  // one wave of one block per SM on an H200
constexpr int kMaxSplits = 128;

// Both merges' last step: float4 c of the output row of (token, head) is a / l times the head's
// gate σ(g), g: the four raw gate values (qg's floats 4c .. 4c + 3 of the head's gate half), loaded
// early by the caller.
__device__ __forceinline__ float4 GatedOutput(float4 g, float4 a, float inv_l) {
  float4 y;
  y.x = a.x * inv_l * SigmoidF(g.x);
  y.y = a.y * inv_l * SigmoidF(g.y);
  y.z = a.z * inv_l * SigmoidF(g.z);
  y.w = a.w * inv_l * SigmoidF(g.w);
  return y;
}
template <int kHd>
__device__ __forceinline__ void StoreGatedOutputWith(float4 g, int nh, int64_t token, int head, int c, float4 a,
                                                     float inv_l, float* __restrict__ o) {
  reinterpret_cast<float4*>(o + (token * nh + head) * kHd)[c] = GatedOutput(g, a, inv_l);
}

// The four raw gate values StoreGatedOutputWith takes: qg's floats 4c .. 4c + 3 of the gate half of
// (token, head) (token rows qg_stride floats apart). Four floats: qg_stride need not keep float4
// alignment.
template <int kHd>
__device__ __forceinline__ float4 LoadGate(const float* __restrict__ qg, int64_t qg_stride, int64_t token, int head,
                                           int c) {
  const float* g = qg + token * qg_stride + head * 2 * kHd + kHd + 4 * c;
  return make_float4(g[0], g[1], g[2], g[3]);
}

// One warp, both merges' first step for one row: from the slices' (max, sum) pairs (slice s's at
// ml + s · kRows · 2; loaded once, lane l holding slices l, l + 32, ..., at most kMaxSplits / 32 of
// them), weight[s] = exp(m_s − max) (0 for an empty slice), for s < splits; returns 1 / Σ weight·l
// to every lane, the sums in SplitMergeKernel's order. through_l2: the pairs are read with
// ld.global.cg (written by other blocks of the running grid).
template <bool kThroughL2>
__device__ __forceinline__ float SliceWeights(const float* ml, int splits, float* weight) {
  constexpr int kPerLane = kMaxSplits / 32;
  const int lane = threadIdx.x & 31;
  float2 p[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int s = lane + 32 * i;
    const float2* at = reinterpret_cast<const float2*>(ml + static_cast<int64_t>(s) * kRows * 2);
    p[i] = s >= splits ? make_float2(-INFINITY, 0.0f) : kThroughL2 ? __ldcg(at) : *at;
  }
  float mm = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + 32 * i < splits) mm = fmaxf(mm, p[i].x);
  }
  mm = WarpMax(mm);
  float ll = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int s = lane + 32 * i;
    if (s >= splits) break;
    const float f = p[i].x == -INFINITY ? 0.0f : expf(p[i].x - mm);
    weight[s] = f;
    ll = fmaf(f, p[i].y, ll);
  }
  return 1.0f / WarpSum(ll);
}

// One (row item, kv head, row r)'s merge, SplitMergeKernel's body, for a block of 256 threads
// (every thread calls it): the slices' (max, sum) pairs weigh their partials, groups of kHd / 4
// threads (a float4 of dims each) stride over the slices, shared memory sums the groups, and the
// first group stores the gated output's float4 c at out + 4c (global memory for the merge kernel;
// the column-split o product's shared memory when it merges, dense_colsplit.cuh). `gate`: thread
// group 0's gate values (LoadGate), asked for by the caller before the merge's loads. kThroughL2:
// the partials read with ld.global.cg (the same values; the o product reads them from L2).
struct MergeShared {
  float weight[kMaxSplits];
  float4 red[256];
  float inv_l;
};
template <int kHd, bool kThroughL2>
__device__ __forceinline__ void MergeSliceRow(int64_t slot0, int r, int splits, const float* __restrict__ part_o,
                                              const float* __restrict__ part_ml, float4 gate, float* out,
                                              MergeShared& sh) {
  constexpr int kLanes = kHd / 4, kSliceGroups = 256 / kLanes;
  const int c = threadIdx.x % kLanes, sg = threadIdx.x / kLanes;
  if (threadIdx.x < 32) {
    const float l_inv = SliceWeights<kThroughL2>(part_ml + (slot0 * kRows + r) * 2, splits, sh.weight);
    if (threadIdx.x == 0) sh.inv_l = l_inv;
  }
  __syncthreads();
  // Slices sg, sg + kSliceGroups, ... in order, the loads of kBatch of them issued before their FMAs
  // (one L2 round trip a slice had been ~5 in a row at ~544 keys).
  constexpr int kBatch = 8;
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = sg; s0 < splits; s0 += kSliceGroups * kBatch) {
    float w[kBatch];
    float4 x[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int s = s0 + b * kSliceGroups;
      w[b] = s < splits ? sh.weight[s] : 0.0f;
      const float4* at = reinterpret_cast<const float4*>(part_o + ((slot0 + s) * kRows + r) * kHd) + c;
      x[b] = w[b] != 0.0f ? (kThroughL2 ? __ldcg(at) : *at) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (w[b] == 0.0f) continue;  // an empty slice: its accumulator may be unwritten
      a.x = fmaf(w[b], x[b].x, a.x);
      a.y = fmaf(w[b], x[b].y, a.y);
      a.z = fmaf(w[b], x[b].z, a.z);
      a.w = fmaf(w[b], x[b].w, a.w);
    }
  }
  sh.red[threadIdx.x] = a;
  __syncthreads();
  if (sg != 0) return;
  for (int g = 1; g < kSliceGroups; ++g) {
    const float4 x = sh.red[g * kLanes + c];
    a.x += x.x;
    a.y += x.y;
    a.z += x.z;
    a.w += x.w;
  }
  reinterpret_cast<float4*>(out)[c] = GatedOutput(gate, a, sh.inv_l);
}

// Block per (row item, kv head, row): combines the slices of SplitAttentionKernel (nothing to do for
// an item of at most short_keys keys: its slice 0 wrote o, and no partials). qg's token rows
// are qg_stride floats apart (at least nh·2hd; a part of a stacked decode product's rows).
// MergeSliceRow does the work. One block an SM is all it needs (a grid of rows × kv heads): the
// bound lets ptxas keep a batch of slice loads in registers (56-60 of them; 32 without it, too few
// for the batch's eight float4s).
template <int kHd>
__global__ void __launch_bounds__(256, 1)
SplitMergeKernel(const float* __restrict__ qg, int64_t qg_stride, int nh, int kvh, const int32_t* __restrict__ items,
                 const int32_t* __restrict__ token_pos, int short_keys, int splits,
                 const float* __restrict__ part_o, const float* __restrict__ part_ml,
                 float* __restrict__ o) {
  constexpr int kLanes = kHd / 4;
  __shared__ MergeShared sh;
  const int groups = nh / kvh, kvhead = blockIdx.y, r = blockIdx.z;
  // Items and positions come from the host (before the step): read before the wait. Every block
  // still waits, so that the grid cannot complete before the split kernel it follows.
  const int32_t first = items[2 * blockIdx.x], count = items[2 * blockIdx.x + 1];
  const int tok = r / groups;
  const bool whole = tok < count && static_cast<int64_t>(token_pos[first + count - 1]) + 1 <= short_keys;
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  if (tok >= count || whole) return;  // whole: the split kernel's slice 0 wrote o
  const int c = threadIdx.x % kLanes, sg = threadIdx.x / kLanes;
  const int head = kvhead * groups + r % groups;
  // The gate of this thread's float4 of the output, read now rather than after the sums.
  const float4 gate = sg == 0 ? LoadGate<kHd>(qg, qg_stride, first + tok, head, c) : make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t slot0 = (static_cast<int64_t>(blockIdx.x) * kvh + kvhead) * splits;
  MergeSliceRow<kHd, false>(slot0, r, splits, part_o, part_ml, gate,
                            o + (static_cast<int64_t>(first + tok) * nh + head) * kHd, sh);
}

// One ticket counter per (row item, kv head) in the scratch's first kAttnTicketBytes.
constexpr int kTicketCount = static_cast<int>(kAttnTicketBytes / sizeof(unsigned));
static_assert(kTicketCount >= kSplitTargetBlocks, "splits > 1 only below kSplitTargetBlocks blocks");
static_assert(kSplitWarps == kRows, "the in-kernel merge gives each row a warp");
static_assert(kMaxSplits % 32 == 0, "the in-kernel merge's lanes hold kMaxSplits / 32 slices each");

// The in-kernel merge (kMergeHere): every slice block of a (row item, kv head) publishes its
// partials and takes a ticket; the last one to arrive combines all slices exactly as
// SplitMergeKernel does (same weights, same slice groups, same order of every f32 operation), so o
// has the same bits without the merge launch, and resets the ticket so that the next launch (a
// graph replay) starts from zero. Block-uniform: every thread of the block calls it. `smem` is the
// block's ring, free by now; `is_last` a shared flag. Partials are read with ld.global.cg (L2): they
// were written by other blocks of this grid.
// The ordering (CUTLASS's semaphore pattern): the block barrier puts every thread's partials before
// thread 0's ticket, an acquire-release add (one MEMBAR.ALL.GPU, then the atomic) publishes them
// and, in the last block, sees every other block's; its block barrier then puts its threads' reads
// after that. (It had been __threadfence in every thread before the ticket and again after it: a
// sequentially consistent fence, MEMBAR.SC.GPU, in every warp, twice.)
template <int kHd>
__device__ __forceinline__ void MergeSlicesIfLast(const float* __restrict__ qg, int64_t qg_stride, int nh, int kvh, int kvhead,
                                                  int32_t first, int32_t count, int splits,
                                                  const float* part_o, const float* part_ml, float* __restrict__ o,
                                                  unsigned* __restrict__ tickets, float* smem, unsigned& is_last) {
  const int groups = nh / kvh;
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kvh + kvhead;
  __syncthreads();  // every thread's partials before thread 0's ticket
  if (threadIdx.x == 0) {
    const unsigned ticket = ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device>(tickets[pair])
                                .fetch_add(1u, ::cuda::memory_order_acq_rel);
    is_last = ticket == static_cast<unsigned>(splits - 1) ? 1u : 0u;
  }
  __syncthreads();  // the other slices' partials (acquired by thread 0) before every thread's reads
  if (is_last == 0) return;
  if (threadIdx.x == 0) tickets[pair] = 0;  // every slice has taken its ticket
  float* weight = smem;                      // rows × kMaxSplits
  float* inv_l = smem + kRows * kMaxSplits;  // rows
  const int64_t slot0 = pair * splits;
  const int lane = threadIdx.x & 31, r = threadIdx.x >> 5;
  // This thread's (row, float4) pairs (see the sums below) and their gates, asked for now: their
  // round trip overlaps the (max, sum) loads' instead of following the sums.
  constexpr int kLanes = kHd / 4, kGroups = 256 / kLanes;
  constexpr int kThreads = kSplitWarps * 32;
  constexpr int kPairs = (kRows * kLanes + kThreads - 1) / kThreads;
  int rr[kPairs], cc[kPairs];
  bool live[kPairs];
  float4 gate[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int p = threadIdx.x + j * kThreads;
    rr[j] = p / kLanes;
    cc[j] = p % kLanes;
    live[j] = p < kRows * kLanes && rr[j] / groups < count;
    gate[j] = live[j] ? LoadGate<kHd>(qg, qg_stride, first + rr[j] / groups, kvhead * groups + rr[j] % groups, cc[j])
                      : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (r / groups < count) {  // SplitMergeKernel's first warp, for row r, in its order
    const float l_inv = SliceWeights<true>(part_ml + (slot0 * kRows + r) * 2, splits, weight + r * kMaxSplits);
    if (lane == 0) inv_l[r] = l_inv;
  }
  __syncthreads();
  // SplitMergeKernel: kGroups groups of kLanes threads (a float4 of dims each), group g summing
  // slices g, g + kGroups, ... in order, then group 0 adding groups 1.. in order. Here a thread
  // keeps all kGroups sums of each of its kPairs (row, float4) pairs and adds them in the same
  // order. The loads of kBatch rounds of kGroups slices (kPairs × kGroups × kBatch float4) are all
  // issued before their FMAs, so that the slices are a few L2 round trips, not one per kGroups
  // (66 slices at ~544 keys, 17 of them with keys: 5 round trips, ~6 us of the merging block at
  // batch 1 in the twenty-fourth session's probe).
  constexpr int kBatch = 4;
  float4 acc[kPairs][kGroups];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) acc[j][g] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int s0 = 0; s0 < splits; s0 += kGroups * kBatch) {
    float w[kBatch][kPairs][kGroups];
    float4 x[kBatch][kPairs][kGroups];
    // f(b, j, g) over the batch's slots: first every load, then every FMA in the merge's order.
    auto each = [&](auto&& f) {
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
#pragma unroll
          for (int g = 0; g < kGroups; ++g) f(b, j, g);
        }
      }
    };
    each([&](int b, int j, int g) {
      const int s = s0 + b * kGroups + g;
      w[b][j][g] = live[j] && s < splits ? weight[rr[j] * kMaxSplits + s] : 0.0f;
      // A zero weight (an empty slice, or past the slices) is skipped as SplitMergeKernel skips it:
      // its accumulator may be unwritten.
      x[b][j][g] = w[b][j][g] != 0.0f
                       ? __ldcg(reinterpret_cast<const float4*>(part_o + ((slot0 + s) * kRows + rr[j]) * kHd) + cc[j])
                       : make_float4(0.f, 0.f, 0.f, 0.f);
    });
    each([&](int b, int j, int g) {
      if (w[b][j][g] == 0.0f) return;
      acc[j][g].x = fmaf(w[b][j][g], x[b][j][g].x, acc[j][g].x);
      acc[j][g].y = fmaf(w[b][j][g], x[b][j][g].y, acc[j][g].y);
      acc[j][g].z = fmaf(w[b][j][g], x[b][j][g].z, acc[j][g].z);
      acc[j][g].w = fmaf(w[b][j][g], x[b][j][g].w, acc[j][g].w);
    });
  }
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    if (!live[j]) continue;
    float4 a = acc[j][0];
#pragma unroll
    for (int g = 1; g < kGroups; ++g) {
      a.x += acc[j][g].x;
      a.y += acc[j][g].y;
      a.z += acc[j][g].z;
      a.w += acc[j][g].w;
    }
    StoreGatedOutputWith<kHd>(gate[j], nh, first + rr[j] / groups, kvhead * groups + rr[j] % groups, cc[j], a,
                              inv_l[rr[j]], o);
  }
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_MERGE_CUH_
