#include "gpu_service/backends/cuda/kernels/attention.cuh"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>

#include "gpu_service/backends/cuda/armed_stamps.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/attention_merge.cuh"
#include "gpu_service/backends/cuda/kernels/attention_probe.h"
#include "gpu_service/backends/cuda/kernels/attention_split.cuh"
#include "gpu_service/backends/cuda/kernels/attention_tc.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/step_probe.h"

namespace tandem::cuda {
namespace {

// SetArmedSplitAttentionProbe's buffer and slot counter (attention_probe.h).
__device__ ArmedStampRows g_split_armed_probe;
__device__ unsigned g_split_armed_count;

// The split attention's kernel: SplitAttendBlock (attention_split.cuh) reading q and every key
// from global memory (it waits for the previous kernel itself).
// kProbe: attention_probe.h's stamped instantiation (probe rows, `capacity` of them; without rows,
// thread 0's row from the armed buffer); the production ones ignore both.
template <int kHd, bool kMergeHere, bool kProbe = false>
__global__ void __launch_bounds__(kSplitWarps * 32, 1)
SplitAttentionKernel(const float* __restrict__ q, const float* __restrict__ qg, int64_t qg_stride, int nh, int kvh,
                     const int32_t* __restrict__ items, const int32_t* __restrict__ token_seq,
                     const int32_t* __restrict__ token_pos, PagedKv cache, float* __restrict__ part_o,
                     float* __restrict__ part_ml, float* __restrict__ o, unsigned* __restrict__ tickets,
                     int short_keys, bool early_kv, unsigned long long* probe, int capacity) {
  unsigned long long* row = nullptr;
  if constexpr (kProbe) {
    const int b = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    if (probe != nullptr) {
      if (b < capacity) row = probe + static_cast<int64_t>(b) * kAttnProbeWords;
    } else if (threadIdx.x == 0) {  // only thread 0 stamps: the others keep no row
      row = TakeArmedRow(g_split_armed_probe, &g_split_armed_count, kAttnProbeWords);
    }
    if (threadIdx.x == 0 && row != nullptr) row[kAttnProbeBlock] = static_cast<unsigned long long>(b);
  }
  SplitAttendBlock<kHd, kMergeHere, false, NoPrep, kProbe>(q, qg, qg_stride, nh, kvh, items, token_seq, token_pos, cache,
                                                           part_o, part_ml, o, tickets, short_keys, early_kv, NoPrep{},
                                                           row);
}

// An instantiation of SplitAttentionKernel with its dynamic shared-memory limit raised to
// SplitSmemBytes (above 48 KiB a kernel needs the opt-in): done once per instantiation
// (thread-safe static); error: that call's result.
using SplitKernelFn = decltype(&SplitAttentionKernel<64, false, false>);
struct SplitKernelReady {
  SplitKernelFn fn;
  cudaError_t error;
};
template <int kHd, bool kMergeHere, bool kProbe>
SplitKernelReady SplitKernel() {
  static const cudaError_t error =
      cudaFuncSetAttribute(SplitAttentionKernel<kHd, kMergeHere, kProbe>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(SplitSmemBytes<kHd>()));
  return SplitKernelReady{SplitAttentionKernel<kHd, kMergeHere, kProbe>, error};
}

// SetSplitAttentionProbe's rows (attention_probe.h).
struct SplitProbe {
  unsigned long long* rows = nullptr;
  int capacity = 0;
};
SplitProbe& SplitProbeRows() {
  static SplitProbe probe;
  return probe;
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
                              cudaStream_t stream, int64_t qg_stride, bool early_kv,
                              AttnDeferredMerge* deferred_merge) {
  // The tensor-core kernels read the gate at the dense row width only.
  if (num_tile_items > 0 && qg_stride != static_cast<int64_t>(d.nh) * 2 * kHd) return cudaErrorInvalidValue;
  if (num_row_items > 0) {
    constexpr size_t smem = SplitSmemBytes<kHd>();
    const SplitProbe probe = SplitProbeRows();
    const SplitScratch parts = SplitScratchOf(scratch, num_row_items, d.kvh, num_splits, kHd);
    float* part_o = parts.part_o;
    float* part_ml = parts.part_ml;
    unsigned* tickets = parts.tickets;
    // The slices merged by their last block (no merge launch) only with AttnMergeInBlock (off by
    // default, attention.cuh), only with the one-launch prep, and not for a hand-made plan with
    // more (item, kv head) pairs than tickets.
    const bool merge_here =
        num_splits > 1 && !OldAttnDecode() && AttnMergeInBlock() && num_row_items * d.kvh <= kTicketCount;
    // Short contexts in one block per (row item, kv head), chosen on the device (see the kernel).
    const int short_keys = num_splits > 1 && !OldAttnSplit() ? AttnShortKeys() : 0;
    const dim3 grid(static_cast<unsigned>(num_row_items), static_cast<unsigned>(d.kvh),
                    static_cast<unsigned>(num_splits));
    // The stamped instantiation while a probe has rows or the step is probed (attention_probe.h).
    const bool stamped = probe.rows != nullptr || ProbeDecodeStep();
    const auto kernel = stamped ? (merge_here ? SplitKernel<kHd, true, true>() : SplitKernel<kHd, false, true>())
                                : (merge_here ? SplitKernel<kHd, true, false>() : SplitKernel<kHd, false, false>());
    if (kernel.error != cudaSuccess) return kernel.error;
    if (cudaError_t e = LaunchPdl(kernel.fn, grid, kSplitWarps * 32, smem, stream, q, qg, qg_stride, d.nh, d.kvh, items,
                                  token_seq, token_pos, cache, part_o, part_ml, o, tickets, short_keys, early_kv,
                                  probe.rows, probe.capacity);
        e != cudaSuccess) {
      return e;
    }
    // A one-token step's merge left to the column-split o product (attention.cuh: the caller asked,
    // one row item, heads whole in o's column super-blocks).
    if (deferred_merge != nullptr && num_splits > 1 && !merge_here && num_row_items == 1 && num_tile_items == 0 &&
        AttnMergeableHd(kHd)) {
      *deferred_merge = AttnDeferredMerge{qg, qg_stride, d.nh, d.kvh, items, token_pos, short_keys, num_splits,
                                          part_o, part_ml};
      return cudaGetLastError();
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
                     const PagedKv& cache, float* o, void* scratch, cudaStream_t stream, int64_t qg_stride = 0,
                     bool early_kv = false, AttnDeferredMerge* deferred_merge = nullptr) {
  if (qg_stride == 0) qg_stride = static_cast<int64_t>(d.nh) * 2 * d.hd;
  if (qg_stride < static_cast<int64_t>(d.nh) * 2 * d.hd) return cudaErrorInvalidValue;
  switch (d.hd) {
    case 64:
      return LaunchAttentionHd<64>(q, qg, d, items, num_row_items, num_splits, num_tile_items, tc_splits, token_seq, token_pos,
                                   cache, o, scratch, stream, qg_stride, early_kv, deferred_merge);
    case 128:
      return LaunchAttentionHd<128>(q, qg, d, items, num_row_items, num_splits, num_tile_items, tc_splits, token_seq, token_pos,
                                    cache, o, scratch, stream, qg_stride, early_kv, deferred_merge);
    case 256:
      return LaunchAttentionHd<256>(q, qg, d, items, num_row_items, num_splits, num_tile_items, tc_splits, token_seq, token_pos,
                                    cache, o, scratch, stream, qg_stride, early_kv, deferred_merge);
    default:
      return cudaErrorInvalidValue;
  }
}


// attention.cuh: one launch by default
ProcessSwitch g_old_attn_decode{[] { return !EnvSwitchDefaultOn("TANDEM_ATTN_DECODE_ONE_PREP"); }};

ProcessSwitch g_attn_merge_in_block{[] { return EnvSwitch("TANDEM_ATTN_MERGE_IN_BLOCK"); }};

// On by default: +1.7% batch-1 decode on q3n-80b (docs/PERF.md, thirty-first session).
ProcessSwitch g_attn_merge_in_out{[] { return EnvSwitchDefaultOn("TANDEM_ATTN_MERGE_IN_OUT"); }};

ProcessSwitch g_old_attn_early_kv{[] { return EnvSwitch("TANDEM_OLD_ATTN_EARLY_KV"); }};

ProcessSwitch g_old_attn_split{[] { return EnvSwitch("TANDEM_OLD_ATTN_SPLIT"); }};

// TANDEM_ATTN_SHORT_KEYS: a non-negative integer (anything else: the default).
ProcessInteger g_attn_short_keys{[] { return EnvInteger("TANDEM_ATTN_SHORT_KEYS", kAttnShortKeysDefault, 0, 1 << 30); }};

}  // namespace

void SetSplitAttentionProbe(unsigned long long* rows, int capacity) {
  SplitProbeRows() = SplitProbe{rows, rows != nullptr ? capacity : 0};
}

cudaError_t SetArmedSplitAttentionProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream) {
  return ArmStampRows(g_split_armed_probe, g_split_armed_count, stamps, capacity, stream);
}

bool OldAttnDecode() { return g_old_attn_decode.on(); }
void SetOldAttnDecode(bool on) { g_old_attn_decode.set(on); }
bool AttnMergeInBlock() { return g_attn_merge_in_block.on(); }
void SetAttnMergeInBlock(bool on) { g_attn_merge_in_block.set(on); }
bool AttnMergeInOut() { return g_attn_merge_in_out.on(); }
void SetAttnMergeInOut(bool on) { g_attn_merge_in_out.set(on); }
bool OldAttnEarlyKv() { return g_old_attn_early_kv.on(); }
void SetOldAttnEarlyKv(bool on) { g_old_attn_early_kv.set(on); }
bool OldAttnSplit() { return g_old_attn_split.on(); }
void SetOldAttnSplit(bool on) { g_old_attn_split.set(on); }
int AttnShortKeys() { return static_cast<int>(g_attn_short_keys.value()); }
void SetAttnShortKeys(int keys) { g_attn_short_keys.set(std::max(keys, 0)); }

AttentionPlan PlanAttention(const std::vector<int32_t>& token_seq, const AttnShape& d, AttentionPrecision precision,
                            int max_tc_splits) {
  AttentionPlan plan;
  if (!AttentionShapeOk(d)) return plan;
  const int groups = d.nh / d.kvh;
  const int32_t n = static_cast<int32_t>(token_seq.size());
  std::vector<int32_t> tiles;
  bool one_item_each = true;
  for (int32_t t = 0; t < n;) {
    int32_t end = t + 1;
    while (end < n && token_seq[end] == token_seq[t]) ++end;
    if (precision == AttentionPrecision::kF16TensorCores && end - t >= kAttnTensorCoreMinTokens) {
      AppendItems(t, end, kTcRows / groups, tiles);
      one_item_each = false;
    } else {
      AppendItems(t, end, kRows / groups, plan.items);
      one_item_each = one_item_each && end - t <= kRows / groups;
    }
    t = end;
  }
  plan.num_row_items = static_cast<int>(plan.items.size() / 2);
  plan.num_tile_items = static_cast<int>(tiles.size() / 2);
  plan.one_item_per_sequence = one_item_each && plan.num_row_items > 0;
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
                            const PagedKv& cache, float* o, void* scratch, cudaStream_t stream, int64_t qg_stride,
                            AttnDeferredMerge* deferred_merge) {
  if (deferred_merge != nullptr) *deferred_merge = AttnDeferredMerge{};
  if (n <= 0) return cudaSuccess;
  if (!AttentionShapeOk(d) || plan.num_row_items + plan.num_tile_items <= 0 ||
      plan.items.size() != 2 * static_cast<size_t>(plan.num_row_items + plan.num_tile_items) ||
      plan.num_splits < 1 || plan.num_splits > kMaxSplits || plan.tc_splits < 1 ||
      plan.tc_splits > kAttnMaxTcSplits || (plan.scratch_bytes > 0 && scratch == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return Dispatch(q, qg, d, items, plan.num_row_items, plan.num_splits, plan.num_tile_items, plan.tc_splits, token_seq,
                  token_pos, cache, o, scratch, stream, qg_stride, plan.one_item_per_sequence && !OldAttnEarlyKv(),
                  n == 1 ? deferred_merge : nullptr);
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
