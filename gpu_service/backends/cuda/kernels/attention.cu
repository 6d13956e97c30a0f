#include "gpu_service/backends/cuda/kernels/attention.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/attention_merge.cuh"
#include "gpu_service/backends/cuda/kernels/attention_tc.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

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

// Without scratch (gridDim.z == 1) the block writes o directly; otherwise it writes its slice's
// unnormalised accumulator, max and sum per row to part_o / part_ml, for SplitMergeKernel
// (kMergeHere false) or for the last slice block of its (row item, kv head) (kMergeHere true:
// MergeSlicesIfLast; then a slice past the context writes only its max and sum, -inf and 0, since
// a weight of 0 keeps the merge from reading its accumulator).
// Short contexts (ctx <= short_keys, decided per row item from token_pos on the device, so that a
// captured graph is right at every context): slice 0 walks the whole context and writes o itself,
// the other slices exit at once and SplitMergeKernel (given the same short_keys) exits too: no
// partials, no merge work. o = a · (1/l) · σ(gate), the merge's operations on one slice, so that up
// to 32 keys (where the split path has a single slice with keys) the bits equal the split path's.
// short_keys 0: never (TANDEM_OLD_ATTN_SPLIT=1, and plans without splits).
template <int kHd, bool kMergeHere>
__global__ void __launch_bounds__(kSplitWarps * 32, 1)
SplitAttentionKernel(const float* __restrict__ q, const float* __restrict__ qg, int64_t qg_stride, int nh, int kvh,
                     const int32_t* __restrict__ items, const int32_t* __restrict__ token_seq,
                     const int32_t* __restrict__ token_pos, PagedKv cache, float* __restrict__ part_o,
                     float* __restrict__ part_ml, float* __restrict__ o, unsigned* __restrict__ tickets,
                     int short_keys) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  constexpr int kPer = kHd / 32;
  constexpr int kStageFloats = kWarpKeys * 2 * kHd;  // per warp: [key][k|v][lane][kPer]
  extern __shared__ float4 split_smem[];
  float* ring = reinterpret_cast<float*>(split_smem);
  float* tail = ring + SplitSmemBytes<kHd>() / sizeof(float) - kSplitWarps * (kRows * 2 + 40);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* wml = tail;                                     // warps × rows × (max, sum)
  float* pw = tail + kSplitWarps * kRows * 2 + warp * 40;  // this warp's 32 p and 8 corrections
  const int groups = nh / kvh, kvhead = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int32_t first = items[2 * blockIdx.x], count = items[2 * blockIdx.x + 1];
  const int32_t seq = token_seq[first];
  const int64_t ctx = static_cast<int64_t>(token_pos[first + count - 1]) + 1;
  const bool whole = ctx <= short_keys;  // block-uniform
  if (whole && split != 0) return;       // touches nothing after the wait
  const int64_t chunk =
      whole ? ctx : ((ctx + splits - 1) / splits + kBlockKeys - 1) / kBlockKeys * kBlockKeys;
  const int64_t begin = split * chunk, end = min(ctx, begin + chunk);
  const int kvw = kvh * kHd;
  __shared__ unsigned is_last;
  if constexpr (kMergeHere) {
    if (begin >= end) {  // a slice past the context (short contexts: most of them)
      if (threadIdx.x < kRows) {
        const int64_t slot = ((static_cast<int64_t>(blockIdx.x) * kvh + kvhead) * splits + split) * kRows + threadIdx.x;
        part_ml[slot * 2] = -INFINITY;
        part_ml[slot * 2 + 1] = 0.0f;
      }
      MergeSlicesIfLast<kHd>(qg, qg_stride, nh, kvh, kvhead, first, count, splits, part_o, part_ml, o, tickets, ring, is_last);
      return;
    }
  }
  const float scale = rsqrtf(static_cast<float>(kHd));

  float qr[kRows][kPer];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int tok = r / groups;
    if (tok < count) {
      const int64_t row = static_cast<int64_t>(first + tok) * nh + kvhead * groups + r % groups;
      LoadLane<kPer>(q + row * kHd + lane * kPer, qr[r]);
#pragma unroll
      for (int i = 0; i < kPer; ++i) qr[r][i] *= scale;
    } else {
#pragma unroll
      for (int i = 0; i < kPer; ++i) qr[r][i] = 0.0f;
    }
  }
  const int my_row = lane & 7;  // the row of this lane's score, and of its max and sum
  const int64_t my_pos = my_row / groups < count ? token_pos[first + my_row / groups] : -1;
  float m = -INFINITY, l = 0.0f, acc[kRows][kPer];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[r][i] = 0.0f;

  float* my_ring = ring + warp * kRingStages * kStageFloats + lane * kPer;
  auto issue = [&](int64_t base, int stage) {
    float* dst = my_ring + stage * kStageFloats;
    int64_t off = 0;
    if (base < end) {
      const int32_t page = cache.page_table[static_cast<int64_t>(seq) * cache.max_pages + base / kKvPageSize];
      off = (static_cast<int64_t>(page) * kKvPageSize + base % kKvPageSize) * kvw + kvhead * kHd + lane * kPer;
    }
#pragma unroll
    for (int k = 0; k < kWarpKeys; ++k) {
      const bool valid = base + k < end;
      CopyLane<kPer>(dst + (2 * k) * kHd, valid ? cache.k + off + k * kvw : cache.k, valid);
      CopyLane<kPer>(dst + (2 * k + 1) * kHd, valid ? cache.v + off + k * kvw : cache.v, valid);
    }
    CpAsyncCommit();  // empty groups too: the wait counts below stay uniform
  };
  const int64_t first_base = begin + warp * kWarpKeys;
#pragma unroll
  for (int s = 0; s < kRingStages - 1; ++s) issue(first_base + s * kBlockKeys, s);
  int stage = 0;
  for (int64_t base = first_base; base < end; base += kBlockKeys) {
    issue(base + (kRingStages - 1) * kBlockKeys, (stage + kRingStages - 1) % kRingStages);
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

  float* wacc = ring;  // warps × rows × kHd
  if (lane < kRows) {
    wml[(warp * kRows + lane) * 2] = m;
    wml[(warp * kRows + lane) * 2 + 1] = l;
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int i = 0; i < kPer; ++i) wacc[(warp * kRows + r) * kHd + lane * kPer + i] = acc[r][i];
  __syncthreads();
  for (int e = threadIdx.x; e < kRows * kHd; e += blockDim.x) {
    const int r = e / kHd, dd = e % kHd;
    float mm = -INFINITY;
    for (int w = 0; w < kSplitWarps; ++w) mm = fmaxf(mm, wml[(w * kRows + r) * 2]);
    float a = 0.0f, ll = 0.0f;
    if (mm != -INFINITY) {
      for (int w = 0; w < kSplitWarps; ++w) {
        const float mw = wml[(w * kRows + r) * 2];
        const float f = mw == -INFINITY ? 0.0f : expf(mw - mm);
        a = fmaf(f, wacc[(w * kRows + r) * kHd + dd], a);
        ll = fmaf(f, wml[(w * kRows + r) * 2 + 1], ll);
      }
    }
    if (splits == 1 || whole) {
      const int tok = r / groups;
      if (tok >= count) continue;
      const int head = kvhead * groups + r % groups;
      const int64_t row = static_cast<int64_t>(first + tok) * nh + head;
      const float gate = SigmoidF(qg[(first + tok) * qg_stride + head * 2 * kHd + kHd + dd]);
      o[row * kHd + dd] = whole ? a * (1.0f / ll) * gate : a / ll * gate;
    } else {
      const int64_t slot = ((static_cast<int64_t>(blockIdx.x) * kvh + kvhead) * splits + split) * kRows + r;
      part_o[slot * kHd + dd] = a;
      if (dd == 0) {
        part_ml[slot * 2] = mm;
        part_ml[slot * 2 + 1] = ll;
      }
    }
  }
  if constexpr (kMergeHere) {
    if (!whole) {  // block-uniform; a whole-context block took no ticket
      MergeSlicesIfLast<kHd>(qg, qg_stride, nh, kvh, kvhead, first, count, splits, part_o, part_ml, o, tickets, ring,
                             is_last);
    }
  }
}

size_t PartialBytes(int64_t blocks, const AttnShape& d) {
  return static_cast<size_t>(blocks) * kRows * (d.hd + 2) * sizeof(float);
}

// The row items' partials (first in the scratch after the tickets), rounded up so that the tile
// items' start aligned.
size_t RowPartialBytes(int num_row_items, int num_splits, const AttnShape& d) {
  if (num_splits <= 1) return 0;
  return (PartialBytes(static_cast<int64_t>(num_row_items) * d.kvh * num_splits, d) + 255) / 256 * 256;
}

template <int kHd>
cudaError_t LaunchAttentionHd(const float* q, const float* qg, const AttnShape& d, const int32_t* items,
                              int num_row_items, int num_splits, int num_tile_items, int tc_splits,
                              const int32_t* token_seq,
                              const int32_t* token_pos, const PagedKv& cache, float* o, void* scratch,
                              cudaStream_t stream, int64_t qg_stride) {
  // The tensor-core kernels read the gate at the dense row width only.
  if (num_tile_items > 0 && qg_stride != static_cast<int64_t>(d.nh) * 2 * kHd) return cudaErrorInvalidValue;
  if (num_row_items > 0) {
    constexpr size_t smem = SplitSmemBytes<kHd>();
    // Above 48 KiB a kernel needs the opt-in; done once per instantiation (thread-safe static).
    static const cudaError_t attribute = cudaFuncSetAttribute(
        SplitAttentionKernel<kHd, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (attribute != cudaSuccess) return attribute;
    static const cudaError_t attribute_merge = cudaFuncSetAttribute(
        SplitAttentionKernel<kHd, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (attribute_merge != cudaSuccess) return attribute_merge;
    float* part_o = nullptr;
    float* part_ml = nullptr;
    unsigned* tickets = nullptr;
    if (num_splits > 1) {
      tickets = static_cast<unsigned*>(scratch);
      part_o = reinterpret_cast<float*>(static_cast<char*>(scratch) + kAttnTicketBytes);
      part_ml = part_o + static_cast<int64_t>(num_row_items) * d.kvh * num_splits * kRows * kHd;
    }
    // The slices merged by their last block (no merge launch) only with AttnMergeInBlock (off by
    // default: measured slower end to end, attention.cuh), only with the one-launch prep, and
    // not for a hand-made plan with more (item, kv head) pairs than tickets.
    const bool merge_here =
        num_splits > 1 && !OldAttnDecode() && AttnMergeInBlock() && num_row_items * d.kvh <= kTicketCount;
    // Short contexts in one block per (row item, kv head), chosen on the device (see the kernel).
    const int short_keys = num_splits > 1 && !OldAttnSplit() ? AttnShortKeys() : 0;
    const dim3 grid(static_cast<unsigned>(num_row_items), static_cast<unsigned>(d.kvh),
                    static_cast<unsigned>(num_splits));
    if (cudaError_t e = LaunchPdl(merge_here ? SplitAttentionKernel<kHd, true> : SplitAttentionKernel<kHd, false>, grid,
                                  kSplitWarps * 32, smem, stream, q, qg, qg_stride, d.nh, d.kvh, items, token_seq, token_pos,
                                  cache, part_o, part_ml, o, tickets, short_keys);
        e != cudaSuccess) {
      return e;
    }
    if (num_splits > 1 && !merge_here) {
      const dim3 merge_grid(static_cast<unsigned>(num_row_items), static_cast<unsigned>(d.kvh), kRows);
      if (cudaError_t e = LaunchPdl(SplitMergeKernel<kHd>, merge_grid, 256, 0, stream, qg, qg_stride, d.nh, d.kvh, items,
                                    token_pos, short_keys, num_splits, part_o, part_ml, o);
          e != cudaSuccess) {
        return e;
      }
    }
  }
  if (num_tile_items > 0) {
    void* tc_partials =
        tc_splits > 1 ? static_cast<char*>(scratch) + kAttnTicketBytes + RowPartialBytes(num_row_items, num_splits, d)
                      : nullptr;
    const cudaError_t e = LaunchTensorCoreAttention(q, qg, d, items + 2 * num_row_items, num_tile_items, token_seq,
                                                    token_pos, cache, o, stream, tc_splits, tc_partials);
    if (e != cudaSuccess) return e;
  }
  return cudaGetLastError();
}

bool AttentionShapeOk(const AttnShape& d) {
  return d.kvh > 0 && d.nh > 0 && d.nh % d.kvh == 0 && kRows % (d.nh / d.kvh) == 0 &&
         (d.hd == 64 || d.hd == 128 || d.hd == 256);
}

// Appends (first, count) pairs covering tokens [t, end) in pieces of at most `per` tokens.
void AppendItems(int32_t t, int32_t end, int per, std::vector<int32_t>& items) {
  for (; t < end; t += per) {
    items.push_back(t);
    items.push_back(std::min(per, end - t));
  }
}

cudaError_t Dispatch(const float* q, const float* qg, const AttnShape& d, const int32_t* items, int num_row_items,
                     int num_splits, int num_tile_items, int tc_splits, const int32_t* token_seq,
                     const int32_t* token_pos,
                     const PagedKv& cache, float* o, void* scratch, cudaStream_t stream, int64_t qg_stride = 0) {
  if (qg_stride == 0) qg_stride = static_cast<int64_t>(d.nh) * 2 * d.hd;
  if (qg_stride < static_cast<int64_t>(d.nh) * 2 * d.hd) return cudaErrorInvalidValue;
  switch (d.hd) {
    case 64:
      return LaunchAttentionHd<64>(q, qg, d, items, num_row_items, num_splits, num_tile_items, tc_splits, token_seq, token_pos,
                                   cache, o, scratch, stream, qg_stride);
    case 128:
      return LaunchAttentionHd<128>(q, qg, d, items, num_row_items, num_splits, num_tile_items, tc_splits, token_seq, token_pos,
                                    cache, o, scratch, stream, qg_stride);
    case 256:
      return LaunchAttentionHd<256>(q, qg, d, items, num_row_items, num_splits, num_tile_items, tc_splits, token_seq, token_pos,
                                    cache, o, scratch, stream, qg_stride);
    default:
      return cudaErrorInvalidValue;
  }
}


std::atomic<bool>& OldAttnDecodeSwitch() {
  static std::atomic<bool> old{!EnvSwitch("TANDEM_ATTN_DECODE_ONE_PREP")};  // attention.cuh: the two launches by default
  return old;
}

std::atomic<bool>& AttnMergeInBlockSwitch() {
  static std::atomic<bool> on{EnvSwitch("TANDEM_ATTN_MERGE_IN_BLOCK")};
  return on;
}

std::atomic<bool>& OldAttnSplitSwitch() {
  static std::atomic<bool> old{EnvSwitch("TANDEM_OLD_ATTN_SPLIT")};
  return old;
}

// TANDEM_ATTN_SHORT_KEYS: a non-negative integer (anything else: the default).
std::atomic<int>& AttnShortKeysValue() {
  static std::atomic<int> keys{
      static_cast<int>(EnvInteger("TANDEM_ATTN_SHORT_KEYS", kAttnShortKeysDefault, 0, 1 << 30))};
  return keys;
}

}  // namespace

bool OldAttnDecode() { return OldAttnDecodeSwitch().load(std::memory_order_relaxed); }
void SetOldAttnDecode(bool on) { OldAttnDecodeSwitch().store(on, std::memory_order_relaxed); }
bool AttnMergeInBlock() { return AttnMergeInBlockSwitch().load(std::memory_order_relaxed); }
void SetAttnMergeInBlock(bool on) { AttnMergeInBlockSwitch().store(on, std::memory_order_relaxed); }
bool OldAttnSplit() { return OldAttnSplitSwitch().load(std::memory_order_relaxed); }
void SetOldAttnSplit(bool on) { OldAttnSplitSwitch().store(on, std::memory_order_relaxed); }
int AttnShortKeys() { return AttnShortKeysValue().load(std::memory_order_relaxed); }
void SetAttnShortKeys(int keys) { AttnShortKeysValue().store(std::max(keys, 0), std::memory_order_relaxed); }

AttentionPlan PlanAttention(const std::vector<int32_t>& token_seq, const AttnShape& d, AttentionPrecision precision,
                            int max_tc_splits) {
  AttentionPlan plan;
  if (!AttentionShapeOk(d)) return plan;
  const int groups = d.nh / d.kvh;
  const int32_t n = static_cast<int32_t>(token_seq.size());
  std::vector<int32_t> tiles;
  for (int32_t t = 0; t < n;) {
    int32_t end = t + 1;
    while (end < n && token_seq[end] == token_seq[t]) ++end;
    if (precision == AttentionPrecision::kF16TensorCores && end - t >= kAttnTensorCoreMinTokens) {
      AppendItems(t, end, kTcRows / groups, tiles);
    } else {
      AppendItems(t, end, kRows / groups, plan.items);
    }
    t = end;
  }
  plan.num_row_items = static_cast<int>(plan.items.size() / 2);
  plan.num_tile_items = static_cast<int>(tiles.size() / 2);
  plan.items.insert(plan.items.end(), tiles.begin(), tiles.end());
  if (plan.num_row_items > 0) {
    const int blocks = plan.num_row_items * d.kvh;
    plan.num_splits = std::clamp((kSplitTargetBlocks + blocks - 1) / blocks, 1, kMaxSplits);
  }
  if (plan.num_tile_items > 0) {
    // As many slices as keep the launch within one wave (one block per SM): at 512 tokens of
    // Qwen3-Next (32 items x 2 kv heads = 64 blocks) two, so the last item's 8 key tiles run as
    // 4 + 4 on two SMs. More slices than that measured slower (a second wave; 3 slices at 512
    // tokens: 168 us against 81 whole, with the first merge kernel).
    const int blocks = plan.num_tile_items * d.kvh;
    plan.tc_splits = std::clamp(kSplitTargetBlocks / blocks, 1, std::clamp(max_tc_splits, 1, kAttnMaxTcSplits));
  }
  plan.scratch_bytes = RowPartialBytes(plan.num_row_items, plan.num_splits, d);
  if (plan.tc_splits > 1) {
    plan.scratch_bytes += TensorCoreAttentionPartialBytes(
        static_cast<int64_t>(plan.num_tile_items) * d.kvh * plan.tc_splits, d.hd);
  }
  if (plan.scratch_bytes > 0) plan.scratch_bytes += kAttnTicketBytes;  // the tickets lead the scratch
  return plan;
}

size_t AttentionMaxScratchBytes(const AttnShape& d) {
  // Splits only happen with blocks = items · kvh < kSplitTargetBlocks, and then
  // blocks · ceil(target / blocks) < target + blocks < 2 · target; tile items: blocks · slices <= target.
  return kAttnTicketBytes + (PartialBytes(2 * kSplitTargetBlocks, d) + 255) / 256 * 256 +
         TensorCoreAttentionPartialBytes(2 * kSplitTargetBlocks, d.hd);
}

cudaError_t LaunchAttention(const float* q, const float* qg, int64_t n, const AttnShape& d, const AttentionPlan& plan,
                            const int32_t* items, const int32_t* token_seq, const int32_t* token_pos,
                            const PagedKv& cache, float* o, void* scratch, cudaStream_t stream, int64_t qg_stride) {
  if (n <= 0) return cudaSuccess;
  if (!AttentionShapeOk(d) || plan.num_row_items + plan.num_tile_items <= 0 ||
      plan.items.size() != 2 * static_cast<size_t>(plan.num_row_items + plan.num_tile_items) ||
      plan.num_splits < 1 || plan.num_splits > kMaxSplits || plan.tc_splits < 1 ||
      plan.tc_splits > kAttnMaxTcSplits || (plan.scratch_bytes > 0 && scratch == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return Dispatch(q, qg, d, items, plan.num_row_items, plan.num_splits, plan.num_tile_items, plan.tc_splits, token_seq,
                  token_pos, cache, o, scratch, stream, qg_stride);
}

std::vector<int32_t> PlanAttentionItems(const std::vector<int32_t>& token_seq, int groups) {
  std::vector<int32_t> items;
  if (groups <= 0 || kRows % groups != 0) return items;
  const int32_t n = static_cast<int32_t>(token_seq.size());
  for (int32_t t = 0; t < n;) {
    int32_t end = t + 1;
    while (end < n && token_seq[end] == token_seq[t]) ++end;
    AppendItems(t, end, kRows / groups, items);
    t = end;
  }
  return items;
}

cudaError_t LaunchAttention(const float* q, const float* qg, int64_t n, const AttnShape& d, const int32_t* items,
                            int num_items, const int32_t* token_seq, const int32_t* token_pos, const PagedKv& cache,
                            float* o, cudaStream_t stream) {
  if (n <= 0 || num_items <= 0) return cudaSuccess;
  if (!AttentionShapeOk(d)) return cudaErrorInvalidValue;
  return Dispatch(q, qg, d, items, num_items, 1, 0, 1, token_seq, token_pos, cache, o, nullptr, stream);
}

}  // namespace tandem::cuda
