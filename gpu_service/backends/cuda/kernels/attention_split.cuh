// The exact split-KV attention's block (row items of attention.cuh's plan), shared by
// SplitAttentionKernel (attention.cu) and the fused decode kernel (attention_decode.cu, which
// prepares the queries and the step's new keys in the block instead of reading them from
// global memory). Device-only; included by those two files (hence the unnamed namespace).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_SPLIT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_SPLIT_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/attention_merge.cuh"
#include "gpu_service/backends/cuda/kernels/attention_probe.h"
#include "gpu_service/backends/cuda/kernels/paged_kv.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"

namespace tandem::cuda {
namespace {

// ---- Exact split-KV attention (row items) ----
//
// Block per (row item, kv head, context slice). The item's up to 8 rows r = (token first + r /
// groups, head kvhead·groups + r % groups) share the keys. Warp w takes 4 keys at a time, keys
// base + 32i + 4w .. +3 of the slice; lane l holds dims [l·kPer, l·kPer + kPer) of q for all 8
// rows and of the output accumulators. K and V rows travel through a per-lane cp.async ring in
// shared memory (each lane reads only what it copied, so no warp synchronisation is needed):
// loads of the next batches overlap the arithmetic of the current one.
// kRows, kSplitWarps, kSplitTargetBlocks, kMaxSplits: attention_merge.cuh.
constexpr int kWarpKeys = 4;        // keys per warp per step: kRows · kWarpKeys == 32 lanes
constexpr int kBlockKeys = kSplitWarps * kWarpKeys;
constexpr int kRingStages = 3;

template <int kHd>
constexpr size_t SplitSmemBytes() {
  constexpr size_t ring = sizeof(float) * kSplitWarps * kRingStages * kWarpKeys * 2 * kHd;
  constexpr size_t merge = sizeof(float) * kSplitWarps * kRows * kHd;  // reuses the ring
  return (ring > merge ? ring : merge) + sizeof(float) * kSplitWarps * (kRows * 2 + 40);
}

// Copies kPer floats (8, 16 or 32 bytes) global -> shared, zero-filled when !valid.
template <int kPer>
__device__ __forceinline__ void CopyLane(float* dst, const float* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  if constexpr (kPer == 2) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
                 "r"(valid ? 8 : 0)
                 : "memory");
  } else {
#pragma unroll
    for (int i = 0; i < kPer / 4; ++i) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst + 4 * i)), "l"(src + 4 * i),
                   "r"(bytes)
                   : "memory");
    }
  }
}

template <int kPer>
__device__ __forceinline__ void LoadLane(const float* p, float (&x)[kPer]) {
  if constexpr (kPer == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    x[0] = v.x;
    x[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < kPer / 4; ++i) {
      const float4 v = *reinterpret_cast<const float4*>(p + 4 * i);
      x[4 * i] = v.x;
      x[4 * i + 1] = v.y;
      x[4 * i + 2] = v.z;
      x[4 * i + 3] = v.w;
    }
  }
}

// Each lane holds 32 partial values; returns to lane l the warp-wide sum of value l (31 shuffles
// instead of 32 · 5: each step halves the values a lane keeps).
template <int kWidth>
__device__ __forceinline__ void TransposeReduceStep(float (&v)[32], int lane) {
  const bool upper = (lane & kWidth) != 0;
#pragma unroll
  for (int i = 0; i < kWidth; ++i) {
    const float send = upper ? v[i] : v[i + kWidth];
    const float keep = upper ? v[i + kWidth] : v[i];
    v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, kWidth);
  }
}
__device__ __forceinline__ float TransposeReduce(float (&v)[32]) {
  const int lane = threadIdx.x & 31;
  TransposeReduceStep<16>(v, lane);
  TransposeReduceStep<8>(v, lane);
  TransposeReduceStep<4>(v, lane);
  TransposeReduceStep<2>(v, lane);
  TransposeReduceStep<1>(v, lane);
  return v[0];
}

// Stores kPer floats from shared memory (src) into this lane's ring slot: the fused decode
// kernel's new keys and values, which are not in the cache yet.
template <int kPer>
__device__ __forceinline__ void StoreLane(float* dst, const float* src) {
#pragma unroll
  for (int i = 0; i < kPer; ++i) dst[i] = src[i];
}

// Copies kPer floats global -> shared through registers, read from L2 (ld.global.cg: rows this
// step's append wrote, which no earlier read of this block left in L1).
template <int kPer>
__device__ __forceinline__ void LoadLaneL2(float* dst, const float* src) {
#pragma unroll
  for (int i = 0; i < kPer; i += 2) {
    const float2 v = __ldcg(reinterpret_cast<const float2*>(src + i));
    dst[i] = v.x;
    dst[i + 1] = v.y;
  }
}

// Where the fused decode kernel's prep put its rows (shared memory): q, the item's kRows query rows
// normed and roped (unscaled), and kv, per new token of the item its k (normed and roped) and v
// rows (2·kHd floats); positions >= from are the new tokens (row pos - from).
struct FreshRows {
  const float* q = nullptr;
  const float* kv = nullptr;
  int64_t from = 0;
};

// The split path's scratch (attention.cuh: tickets first, then the row items' partials): the
// ticket counters, each slice block's unnormalised output rows and its (max, sum) per row; all
// null without splits.
struct SplitScratch {
  unsigned* tickets = nullptr;
  float* part_o = nullptr;
  float* part_ml = nullptr;
};
inline SplitScratch SplitScratchOf(void* scratch, int num_row_items, int kvh, int num_splits, int hd) {
  SplitScratch s;
  if (num_splits <= 1) return s;
  s.tickets = static_cast<unsigned*>(scratch);
  s.part_o = reinterpret_cast<float*>(static_cast<char*>(scratch) + kAttnTicketBytes);
  s.part_ml = s.part_o + static_cast<int64_t>(num_row_items) * kvh * num_splits * kRows * hd;
  return s;
}

// Key k of a ring stage (dst: this lane's slot of the stage) <- the fused kernel's shared rows of
// the new token at position pos: this lane's kHd / 32 floats of its key and of its value.
template <int kHd>
__device__ __forceinline__ void StoreFreshKey(float* dst, int k, const FreshRows& fresh, int64_t pos, int lane) {
  constexpr int kPer = kHd / 32;
  const float* row = fresh.kv + (pos - fresh.from) * 2 * kHd + lane * kPer;
  StoreLane<kPer>(dst + (2 * k) * kHd, row);
  StoreLane<kPer>(dst + (2 * k + 1) * kHd, row + kHd);
}

// The float4 chunk of a row of the block merge's per-warp accumulators that holds the row's chunk
// c: pairs of chunks swapped in every other group of 8, so that the 8 lanes of a quarter warp storing
// chunks 2l + h (kHd 256: 8 values a lane) land on 8 different bank groups, while 32 consecutive
// chunks (the merge's reads) stay 512 contiguous bytes.
__device__ __forceinline__ int WaccChunk(int c) { return c ^ ((c >> 3) & 1); }

// SplitAttentionKernel's prep: nothing to prepare.
struct NoPrep {
  __device__ __forceinline__ FreshRows operator()(int32_t, int32_t, int32_t, int64_t, int64_t) const {
    return FreshRows{};
  }
};

// The work of one block of the split attention's grid (row item blockIdx.x, kv head blockIdx.y,
// context slice blockIdx.z), PDL wait included (below). Without scratch (gridDim.z == 1) the block
// writes o directly; otherwise it writes its slice's unnormalised accumulator, max and sum per row
// to part_o / part_ml, for SplitMergeKernel
// (kMergeHere false) or for the last slice block of its (row item, kv head) (kMergeHere true:
// MergeSlicesIfLast; then a slice past the context writes only its max and sum, -inf and 0, since
// a weight of 0 keeps the merge from reading its accumulator).
// Short contexts (ctx <= short_keys, decided per row item from token_pos on the device, so that a
// captured graph is right at every context): slice 0 walks the whole context and writes o itself,
// the other slices exit at once and SplitMergeKernel (given the same short_keys) exits too: no
// partials, no merge work. o = a · (1/l) · σ(gate), the merge's operations on one slice, so that up
// to 32 keys (where the split path has a single slice with keys) the bits equal the split path's.
// short_keys 0: never (TANDEM_OLD_ATTN_SPLIT=1, and plans without splits).
// The block waits for the previous kernel (PdlWaitForPrevious) itself, after reading what the
// host wrote before the step (items, rows, positions, page table) and, with early_kv, after
// copying the keys and values of positions before its item's first token (earlier steps' appends)
// into its ring: those reads then overlap the previous kernel. early_kv needs each sequence's
// tokens in one item (AttentionPlan::one_item_per_sequence): else an earlier item of the same
// sequence appends keys in this step.
// kProbe (attention_probe.h): thread 0 stamps the block's phases into probe_row (null: none); the
// production instantiations compile without it.
// prep(first, count, seq, begin, end) runs once the block knows its slice and has keys to attend
// to, before q is read: SplitAttentionKernel's does nothing (kFresh false: q and every key from
// global memory); the fused decode kernel's (attention_decode.cu, kFresh true) computes the
// queries and the step's new keys and values in shared memory and returns where they are.
template <int kHd, bool kMergeHere, bool kFresh, typename Prep, bool kProbe = false>
__device__ __forceinline__ void SplitAttendBlock(const float* __restrict__ q, const float* __restrict__ qg,
                                                 int64_t qg_stride, int nh, int kvh, const int32_t* __restrict__ items,
                                                 const int32_t* __restrict__ token_seq,
                                                 const int32_t* __restrict__ token_pos, PagedKv cache,
                                                 float* __restrict__ part_o, float* __restrict__ part_ml,
                                                 float* __restrict__ o, unsigned* __restrict__ tickets,
                                                 int short_keys, bool early_kv, Prep prep,
                                                 unsigned long long* probe_row = nullptr) {
  auto put = [&](int word, unsigned long long value) {
    if constexpr (kProbe) {
      if (threadIdx.x == 0 && probe_row != nullptr) probe_row[word] = value;
    }
  };
  auto stamp = [&](int word) {
    if constexpr (kProbe) put(word, GlobalTimerNs());
  };
  stamp(kAttnProbeEntry);
  constexpr int kPer = kHd / 32;
  constexpr int kStageFloats = kWarpKeys * 2 * kHd;  // per warp: [key][k|v][lane][kPer]
  extern __shared__ float4 split_smem[];
  float* ring = reinterpret_cast<float*>(split_smem);
  float* tail = ring + SplitSmemBytes<kHd>() / sizeof(float) - kSplitWarps * (kRows * 2 + 40);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* wml = tail;                                     // warps × rows × (max, sum)
  float* pw = tail + kSplitWarps * kRows * 2 + warp * 40;  // this warp's 32 p and 8 corrections
  const int groups = nh / kvh, kvhead = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  // The step's items, rows and positions come from the host (copied before the step), so they are
  // read before the PDL wait (pdl.cuh: no kernel of the step writes them).
  const int32_t first = items[2 * blockIdx.x], count = items[2 * blockIdx.x + 1];
  const int32_t seq = token_seq[first];
  const int64_t ctx = static_cast<int64_t>(token_pos[first + count - 1]) + 1;
  const bool whole = ctx <= short_keys;  // block-uniform
  if (whole && split != 0) {  // touches no data of the step: no wait needed
    stamp(kAttnProbeExit);
    return;
  }
  const int64_t chunk =
      whole ? ctx : ((ctx + splits - 1) / splits + kBlockKeys - 1) / kBlockKeys * kBlockKeys;
  const int64_t begin = split * chunk, end = min(ctx, begin + chunk);
  const int kvw = kvh * kHd;
  const int my_row = lane & 7;  // the row of this lane's score, and of its max and sum
  const int64_t my_pos = my_row / groups < count ? token_pos[first + my_row / groups] : -1;
  // Keys before the item's first token were appended by earlier steps; with early_kv (each
  // sequence's tokens in one item, so that no other item of this step appends any of them) the
  // ring's first stages copy them before the wait, and the item's own new keys after it.
  const int64_t defer_from = early_kv ? static_cast<int64_t>(token_pos[first]) : -1;
  float* my_ring = ring + warp * kRingStages * kStageFloats + lane * kPer;
  // Stage `stage` <- keys base .. base + 3 (this warp's next batch): cp.async from the cache,
  // zero-filled past the slice; with `early`, keys at or after defer_from are left alone, for the
  // fill after the wait below. Without `early`, the fused kernel's new keys (kFresh, positions >=
  // fresh.from) come from its shared rows.
  auto issue_keys = [&](int64_t base, int stage, bool early, const FreshRows& fresh) {
    if (base >= end) {  // a stage past the slice is never read: no (zero-filled) copies for it
      CpAsyncCommit();
      return;
    }
    float* dst = my_ring + stage * kStageFloats;
    const int64_t off = CacheOffset(cache, seq, base, kvw) + kvhead * kHd + lane * kPer;
#pragma unroll
    for (int k = 0; k < kWarpKeys; ++k) {
      const bool valid = base + k < end;
      if (early && valid && base + k >= defer_from) continue;
      if constexpr (kFresh) {
        if (!early && valid && base + k >= fresh.from) {  // a new token's row: from shared memory
          StoreFreshKey<kHd>(dst, k, fresh, base + k, lane);
          continue;
        }
      }
      CopyLane<kPer>(dst + (2 * k) * kHd, valid ? cache.k + off + k * kvw : cache.k, valid);
      CopyLane<kPer>(dst + (2 * k + 1) * kHd, valid ? cache.v + off + k * kvw : cache.v, valid);
    }
    CpAsyncCommit();  // empty groups too: the wait counts below stay uniform
  };
  const int64_t first_base = begin + warp * kWarpKeys;
  // With early_kv, this lane's cache offset of each early stage's first key (a batch of kWarpKeys
  // keys shares a page, as issue_keys assumes), taken before the wait (the page table comes from the
  // host) so that the fill of the step's new keys after it is one load, not a page-table load first.
  int64_t early_off[kRingStages - 1];
#pragma unroll
  for (int s = 0; s < kRingStages - 1; ++s) {
    const int64_t base = first_base + s * kBlockKeys;
    early_off[s] = early_kv && base < end ? CacheOffset(cache, seq, base, kvw) + kvhead * kHd + lane * kPer : 0;
  }
  if (early_kv && begin < end) {
#pragma unroll
    for (int s = 0; s < kRingStages - 1; ++s) issue_keys(first_base + s * kBlockKeys, s, true, FreshRows{});
  }
  PdlWaitForPrevious();  // pdl.cuh: the step's rows (q, the new keys, the gates) only after it
  PdlAllowNext();
  stamp(kAttnProbeAfterWait);
  if constexpr (kProbe) {
    const unsigned smid = SmId();
    put(kAttnProbeSm, smid);
    put(kAttnProbeKeys, static_cast<unsigned long long>(end > begin ? end - begin : 0));
  }
  __shared__ unsigned is_last;
  if constexpr (kMergeHere) {
    if (begin >= end) {  // a slice past the context (short contexts: most of them)
      if (threadIdx.x < kRows) {
        const int64_t slot = ((static_cast<int64_t>(blockIdx.x) * kvh + kvhead) * splits + split) * kRows + threadIdx.x;
        part_ml[slot * 2] = -INFINITY;
        part_ml[slot * 2 + 1] = 0.0f;
      }
      MergeSlicesIfLast<kHd>(qg, qg_stride, nh, kvh, kvhead, first, count, splits, part_o, part_ml, o, tickets, ring, is_last);
      put(kAttnProbeMerged, is_last);
      stamp(kAttnProbeExit);
      return;
    }
  }
  // The fused decode kernel's preparation (queries, the step's new keys and values, their append)
  // for the slice [begin, end) of a context of ctx keys; nothing for SplitAttentionKernel.
  const FreshRows fresh = prep(first, count, seq, begin, end);
  const float scale = rsqrtf(static_cast<float>(kHd));

  // The query rows: every row's load is issued (rows past the item's tokens read its last token's
  // row and are zeroed below), so that all of them are one round trip; a branch a row made them one
  // L2 round trip each (~2 us at batch 1, the twenty-fourth session's probe).
  float qr[kRows][kPer];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int tok = min(r / groups, count - 1);
    if constexpr (kFresh) {
      LoadLane<kPer>(fresh.q + r * kHd + lane * kPer, qr[r]);
    } else {
      const int64_t row = static_cast<int64_t>(first + tok) * nh + kvhead * groups + r % groups;
      LoadLane<kPer>(q + row * kHd + lane * kPer, qr[r]);
    }
  }
  if (early_kv) {
    // The new keys of the stages copied before the wait (the cache rows this step's append wrote,
    // or the fused kernel's shared rows), into the slots that copy left alone; their loads go out
    // while the query rows' are in flight.
#pragma unroll
    for (int s = 0; s < kRingStages - 1; ++s) {
      const int64_t base = first_base + s * kBlockKeys;
      float* dst = my_ring + s * kStageFloats;
#pragma unroll
      for (int k = 0; k < kWarpKeys; ++k) {
        const int64_t pos = base + k;
        if (pos >= end || pos < defer_from) continue;
        if constexpr (kFresh) {
          StoreFreshKey<kHd>(dst, k, fresh, pos, lane);
        } else {
          const int64_t off = early_off[s] + k * kvw;
          LoadLaneL2<kPer>(dst + (2 * k) * kHd, cache.k + off);
          LoadLaneL2<kPer>(dst + (2 * k + 1) * kHd, cache.v + off);
        }
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < kRingStages - 1; ++s) issue_keys(first_base + s * kBlockKeys, s, false, fresh);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const bool live = r / groups < count;
#pragma unroll
    for (int i = 0; i < kPer; ++i) qr[r][i] = live ? qr[r][i] * scale : 0.0f;
  }
  stamp(kAttnProbeQLoaded);
  float m = -INFINITY, l = 0.0f, acc[kRows][kPer];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[r][i] = 0.0f;
  int stage = 0;
  for (int64_t base = first_base; base < end; base += kBlockKeys) {
    issue_keys(base + (kRingStages - 1) * kBlockKeys, (stage + kRingStages - 1) % kRingStages, false, fresh);
    CpAsyncWait<kRingStages - 1>();
    const float* src = my_ring + stage * kStageFloats;
    stage = (stage + 1) % kRingStages;
    float sv[32];
#pragma unroll
    for (int k = 0; k < kWarpKeys; ++k) {
      float kr[kPer];
      LoadLane<kPer>(src + (2 * k) * kHd, kr);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < kPer; ++i) d = fmaf(qr[r][i], kr[i], d);
        sv[k * kRows + r] = d;
      }
    }
    float sc = TransposeReduce(sv);  // lane l: key l / 8, row l % 8
    const int64_t kp = base + (lane >> 3);
    if (kp >= end || kp > my_pos) sc = -INFINITY;
    float mx = fmaxf(sc, __shfl_xor_sync(0xFFFFFFFFu, sc, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 16));
    const float m_new = fmaxf(m, mx);
    const float corr = m_new == -INFINITY ? 1.0f : expf(m - m_new);
    const float p = m_new == -INFINITY ? 0.0f : expf(sc - m_new);
    float ps = p + __shfl_xor_sync(0xFFFFFFFFu, p, 8);
    ps += __shfl_xor_sync(0xFFFFFFFFu, ps, 16);
    l = l * corr + ps;
    m = m_new;
    __syncwarp();  // the previous step's p and corrections have been read
    pw[lane] = p;
    if (lane < kRows) pw[32 + lane] = corr;
    __syncwarp();
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float c = pw[32 + r];
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[r][i] *= c;
    }
#pragma unroll
    for (int k = 0; k < kWarpKeys; ++k) {
      float vr[kPer];
      LoadLane<kPer>(src + (2 * k + 1) * kHd, vr);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float pk = pw[k * kRows + r];
#pragma unroll
        for (int i = 0; i < kPer; ++i) acc[r][i] = fmaf(pk, vr[i], acc[r][i]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // every warp is done with the ring: reuse it for the block merge
  stamp(kAttnProbeLoopDone);

  // The block's merge of its warps: thread t takes (row, float4) pairs t, t + 256, ... of the
  // item's kRows rows, with the per-element f32 operations of the scalar loop it replaced (same
  // bits). The warps' accumulators are stored swizzled (WaccChunk) so that neither the stores of a
  // lane's kPer consecutive values nor the pairs' float4 reads conflict in shared memory (the scalar
  // stores were 8-way conflicts and the loop one smem chain an element: ~4 us at batch 1, the
  // twenty-fourth session's probe).
  constexpr int kChunks = kHd / 4;  // float4s a row
  constexpr int kThreads = kSplitWarps * 32;
  constexpr int kPairs = (kRows * kChunks + kThreads - 1) / kThreads;
  const bool to_o = splits == 1 || whole;  // block-uniform: this block writes o itself
  // The gates of this thread's output pairs, asked for now so that their round trip overlaps the
  // shared-memory merge below.
  float4 gate[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int p = threadIdx.x + j * kThreads, r = p / kChunks, c4 = p % kChunks;
    gate[j] = to_o && p < kRows * kChunks && r / groups < count
                  ? LoadGate<kHd>(qg, qg_stride, first + r / groups, kvhead * groups + r % groups, c4)
                  : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float* wacc = ring;  // warps × rows × kHd, float4 chunks at WaccChunk
  if (lane < kRows) {
    wml[(warp * kRows + lane) * 2] = m;
    wml[(warp * kRows + lane) * 2 + 1] = l;
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float* row = wacc + (warp * kRows + r) * kHd;
    if constexpr (kPer == 2) {
      *reinterpret_cast<float2*>(row + 4 * WaccChunk(lane >> 1) + 2 * (lane & 1)) = make_float2(acc[r][0], acc[r][1]);
    } else {
#pragma unroll
      for (int h = 0; h < kPer / 4; ++h) {
        *reinterpret_cast<float4*>(row + 4 * WaccChunk(lane * (kPer / 4) + h)) =
            make_float4(acc[r][4 * h], acc[r][4 * h + 1], acc[r][4 * h + 2], acc[r][4 * h + 3]);
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int p = threadIdx.x + j * kThreads, r = p / kChunks, c4 = p % kChunks;
    if (p >= kRows * kChunks) continue;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < kSplitWarps; ++w) mm = fmaxf(mm, wml[(w * kRows + r) * 2]);
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    float ll = 0.0f;
    if (mm != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kSplitWarps; ++w) {
        const float mw = wml[(w * kRows + r) * 2];
        const float f = mw == -INFINITY ? 0.0f : expf(mw - mm);
        const float4 x = *reinterpret_cast<const float4*>(wacc + (w * kRows + r) * kHd + 4 * WaccChunk(c4));
        a.x = fmaf(f, x.x, a.x);
        a.y = fmaf(f, x.y, a.y);
        a.z = fmaf(f, x.z, a.z);
        a.w = fmaf(f, x.w, a.w);
        ll = fmaf(f, wml[(w * kRows + r) * 2 + 1], ll);
      }
    }
    if (to_o) {
      const int tok = r / groups;
      if (tok >= count) continue;
      const int64_t row = static_cast<int64_t>(first + tok) * nh + kvhead * groups + r % groups;
      const float gx = SigmoidF(gate[j].x), gy = SigmoidF(gate[j].y), gz = SigmoidF(gate[j].z),
                  gw = SigmoidF(gate[j].w);
      float4 y;
      if (whole) {
        y = make_float4(a.x * (1.0f / ll) * gx, a.y * (1.0f / ll) * gy, a.z * (1.0f / ll) * gz, a.w * (1.0f / ll) * gw);
      } else {
        y = make_float4(a.x / ll * gx, a.y / ll * gy, a.z / ll * gz, a.w / ll * gw);
      }
      reinterpret_cast<float4*>(o + row * kHd)[c4] = y;
    } else {
      const int64_t slot = ((static_cast<int64_t>(blockIdx.x) * kvh + kvhead) * splits + split) * kRows + r;
      reinterpret_cast<float4*>(part_o + slot * kHd)[c4] = a;
      if (c4 == 0) {
        part_ml[slot * 2] = mm;
        part_ml[slot * 2 + 1] = ll;
      }
    }
  }
  stamp(kAttnProbePartials);
  if constexpr (kMergeHere) {
    if (!whole) {  // block-uniform; a whole-context block took no ticket
      MergeSlicesIfLast<kHd>(qg, qg_stride, nh, kvh, kvhead, first, count, splits, part_o, part_ml, o, tickets, ring,
                             is_last);
      put(kAttnProbeMerged, is_last);
    }
  }
  stamp(kAttnProbeExit);
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_SPLIT_CUH_
