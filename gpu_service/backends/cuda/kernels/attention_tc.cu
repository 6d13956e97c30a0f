#include "gpu_service/backends/cuda/kernels/attention_tc.cuh"

#include <cuda_fp16.h>

#include <atomic>
#include <cstdlib>

#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/attention_tc_common.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/sm90a_device.h"

namespace tandem::cuda {
namespace {

using attn_tc::BlockOf;
using attn_tc::CpAsync16OrZero;
using attn_tc::GatedOutput;
using attn_tc::OnlineSoftmaxTile;
using attn_tc::QueryRow;
using attn_tc::RescaleRows;
using attn_tc::SlicesOf;
using attn_tc::StoreRows;
using attn_tc::TcBlock;
using attn_tc::TcSlices;

constexpr int kTcKeys = 64;
static_assert(kTcKeys == kKvPageSize, "a key tile is one cache page");

__device__ __forceinline__ void StoreF16x4(__half* dst, float4 v) {
  *reinterpret_cast<uint2*>(dst) = make_uint2(PackF16x2(v.x, v.y), PackF16x2(v.z, v.w));
}

// ---- The pipelined tensor-core kernel (kF16TensorCores) ----
//
// Block of 8 warps per (tile item, kv head): kTcRows = 128 query rows (token first + r / groups,
// head kvhead·groups + r % groups; at GQA 8 that is 16 tokens × the 8 heads of the kv head, so
// every K/V tile read serves all 8 heads), warp w owning rows 16w..16w+15, one block per SM (the
// f32 output accumulators of 16 rows at hd 256 take 128 registers per thread). The math is the
// earlier kernel's: m16n8k16 f16 mma with f32 accumulators, f32 online softmax in base 2.
// The cache is f32, so a K or V tile (64 positions, one cache page) is copied with cp.async into
// an f32 staging area and converted to f16 rows (16 bytes of padding: conflict-free ldmatrix) by
// the thread that copied it, which needs no barrier between the copy and the conversion. The
// staging area holds one tile: V(t) is in flight while S = Q·K(t)ᵀ runs, K(t+1) while the softmax
// and O += P·V(t) run, so the loads hide behind the arithmetic instead of stalling the block.
constexpr int kPipeWarps = 8, kPipeThreads = kPipeWarps * 32, kPipeKeys = kKvPageSize;
static_assert(kTcRows == kPipeWarps * 16, "a warp owns 16 query rows");

template <int kHd>
struct PipeSmem {
  static constexpr int kStride = kHd + 8;  // f16 per Q/K/V row
  static constexpr size_t kStage = sizeof(float) * kPipeKeys * kHd;
  static constexpr size_t kQ = sizeof(__half) * kTcRows * kStride;
  static constexpr size_t kKv = sizeof(__half) * kPipeKeys * kStride;
  static constexpr size_t kBytes = kStage + kQ + 2 * kKv;
};

// This thread's share of one K or V tile (`page`, the kv head's slice) into the staging area, as
// one cp.async group. Keys from valid_keys on are zero-filled: unwritten cache may hold NaN.
// Thread tid copies and converts float4 number tid + i·kPipeThreads of a tile: column 4·(tid %
// kVec) of keys tid / kVec + i·kKeyStep, so the per-i offsets are compile-time steps off one base
// (no per-i addresses held in registers across the main loop).
template <int kHd>
struct TileShare {
  static constexpr int kVec = kHd / 4, kKeyStep = kPipeThreads / kVec, kPer = kPipeKeys / kKeyStep;
  static_assert(kPipeThreads % kVec == 0 && kPipeKeys % kKeyStep == 0, "");
};

// This thread's share of one K or V tile (`page`, the kv head's slice) into the staging area, as
// one cp.async group. Keys from valid_keys on are zero-filled: unwritten cache may hold NaN.
template <int kHd>
__device__ __forceinline__ void StageTile(const float* pool, int32_t page, int kvhead, int kvw, int valid_keys,
                                          float4* stage, int tid) {
  using T = TileShare<kHd>;
  const int j0 = tid / T::kVec;
  const float* src = pool + (static_cast<int64_t>(page) * kKvPageSize + j0) * kvw + kvhead * kHd + 4 * (tid % T::kVec);
  const uint32_t dst = SmemAddr(stage + tid);
#pragma unroll
  for (int i = 0; i < T::kPer; ++i) {
    CpAsync16OrZero(dst + i * kPipeThreads * 16, src, j0 + i * T::kKeyStep < valid_keys);
    src += T::kKeyStep * kvw;
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits for this thread's staged share and stores it as f16 rows of `dst`.
template <int kHd>
__device__ __forceinline__ void ConvertStagedTile(const float4* stage, __half* dst, int tid) {
  using T = TileShare<kHd>;
  constexpr int kStride = PipeSmem<kHd>::kStride;
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __half* row = dst + (tid / T::kVec) * kStride + 4 * (tid % T::kVec);
#pragma unroll
  for (int i = 0; i < T::kPer; ++i) StoreF16x4(row + i * T::kKeyStep * kStride, stage[tid + i * kPipeThreads]);
}

template <int kHd>
__global__ void __launch_bounds__(kPipeThreads, 1)
PipelinedTensorCoreAttentionKernel(const float* __restrict__ q, const float* __restrict__ qg, int nh, int kvh,
                                   const int32_t* __restrict__ items, const int32_t* __restrict__ token_seq,
                                   const int32_t* __restrict__ token_pos, PagedKv cache, float* __restrict__ o,
                                   int splits, float* __restrict__ part_o, float* __restrict__ part_ml) {
  PdlWaitForPrevious();  // pdl.cuh: q, the cache and the items are the step's
  PdlAllowNext();
  constexpr int kStride = PipeSmem<kHd>::kStride;
  constexpr int kVec = kHd / 4;
  extern __shared__ float4 pipe_smem[];
  float4* stage = pipe_smem;
  __half* qs = reinterpret_cast<__half*>(reinterpret_cast<char*>(pipe_smem) + PipeSmem<kHd>::kStage);
  __half* ks = qs + kTcRows * kStride;
  __half* vs = ks + kPipeKeys * kStride;
  __shared__ int32_t row_pos[kTcRows];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const TcBlock blk = BlockOf(nh, kvh, splits, items, token_seq, token_pos, cache);  // attention_tc_common.cuh
  const int kvhead = blk.kvhead, groups = blk.groups, kvw = kvh * kHd;
  const int32_t first = blk.first, count = blk.count, min_pos = blk.min_pos, max_pos = blk.max_pos;
  const int32_t* pages = blk.pages;
  const int kt_begin = blk.kt_begin, kt_end = blk.kt_end;
  if (kt_begin >= kt_end) return;  // an empty slice (short item): uniform over the block
  auto valid_keys = [&](int kt) { return min(kPipeKeys, max_pos - kt * kPipeKeys + 1); };

  StageTile<kHd>(cache.k, pages[kt_begin], kvhead, kvw, valid_keys(kt_begin), stage, tid);
  if (tid < kTcRows) row_pos[tid] = tid / groups < count ? token_pos[first + tid / groups] : -1;
#pragma unroll 8
  for (int e = tid; e < kTcRows * kVec; e += kPipeThreads) {
    const int r = e / kVec, c = e % kVec, tok = r / groups;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (tok < count) {
      x = *reinterpret_cast<const float4*>(q + QueryRow(first, tok, r, groups, nh, kvhead) * kHd + 4 * c);
    }
    StoreF16x4(qs + r * kStride + 4 * c, x);
  }
  ConvertStagedTile<kHd>(stage, ks, tid);
  __syncthreads();  // Q, K(0) and row_pos visible; the staging area is free again
  StageTile<kHd>(cache.v, pages[kt_begin], kvhead, kvw, valid_keys(kt_begin), stage, tid);

  const float scale_log2 = 1.4426950408889634f * rsqrtf(static_cast<float>(kHd));
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = warp * 16 + g;  // this thread's rows: row0 and row0 + 8
  const int32_t pos_lo = row_pos[row0], pos_hi = row_pos[row0 + 8];
  float acc[kHd / 8][4];
#pragma unroll
  for (int i = 0; i < kHd / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  const auto accessor = [&acc](int nd, int c) -> float& { return acc[nd][c]; };  // StoreRows' acc(nd, c)
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const bool more = kt + 1 < kt_end;
    const int32_t next_page = more ? pages[kt + 1] : 0;  // read early: its latency hides behind S
    float s[kPipeKeys / 8][4];
#pragma unroll
    for (int i = 0; i < kPipeKeys / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kHd / 16; ++kk) {
      uint32_t a[4];
      LdMatrixX4(a, SmemAddr(qs + (warp * 16 + (lane & 15)) * kStride + kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int nb = 0; nb < kPipeKeys / 16; ++nb) {
        uint32_t b[4];
        LdMatrixX4(b, SmemAddr(ks + (nb * 16 + (lane >> 4) * 8 + (lane & 7)) * kStride + kk * 16 +
                               ((lane >> 3) & 1) * 8));
        MmaF16(s[2 * nb], a, b[0], b[1]);
        MmaF16(s[2 * nb + 1], a, b[2], b[3]);
      }
    }
    ConvertStagedTile<kHd>(stage, vs, tid);  // V(kt)
    __syncthreads();                         // V(kt) visible; every warp is done with K(kt)
    if (more) StageTile<kHd>(cache.k, next_page, kvhead, kvw, valid_keys(kt + 1), stage, tid);

    // Online softmax in base 2; masking only where the tile reaches past the first row's position.
    const bool mask = kt * kPipeKeys + kPipeKeys - 1 > min_pos;
    float corr[2];
    // s[kPipeKeys / 8][4] is the layout's s[4nb + c] (OnlineSoftmaxTile) as rows of 4: the same floats.
    OnlineSoftmaxTile<kPipeKeys>(reinterpret_cast<float(&)[kPipeKeys / 2]>(s), m, l, corr, scale_log2, mask,
                                 kt * kPipeKeys, t4, pos_lo, pos_hi);
    RescaleRows<kHd>(accessor, corr);

#pragma unroll
    for (int kk = 0; kk < kPipeKeys / 16; ++kk) {
      const uint32_t a[4] = {PackF16x2(s[2 * kk][0], s[2 * kk][1]), PackF16x2(s[2 * kk][2], s[2 * kk][3]),
                             PackF16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             PackF16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nd = 0; nd < kHd / 16; ++nd) {
        uint32_t b[4];
        LdMatrixX4Trans(b, SmemAddr(vs + (kk * 16 + (lane & 15)) * kStride + nd * 16 + (lane >> 4) * 8));
        MmaF16(acc[2 * nd], a, b[0], b[1]);
        MmaF16(acc[2 * nd + 1], a, b[2], b[3]);
      }
    }
    if (more) {
      ConvertStagedTile<kHd>(stage, ks, tid);  // K(kt + 1)
      __syncthreads();                         // K(kt + 1) visible; every warp is done with V(kt)
      StageTile<kHd>(cache.v, next_page, kvhead, kvw, valid_keys(kt + 1), stage, tid);
    }
  }

  StoreRows<kHd>(accessor, m, l, row0, t4, blk, nh, kvh, splits, qg, o, part_o, part_ml);
}

// Block per (tile item, kv head, kRowsAtOnce rows): combines the slices an item's keys were cut
// into (items that fit one slice were written by the kernel). A thread takes a float4 of one row:
// the slices' weights exp2(m_s - max) from the (max, sum) pairs, then o = sum_s w_s · acc_s /
// sum_s w_s · l_s, gated as the kernel gates. Many small blocks, not one per item: a block that
// walks its item's 128 rows in turn waits on a dependent load per row (measured 2x slower).
template <int kHd>
constexpr int MergeRowsPerBlock() {
  return 256 / (kHd / 4);
}

template <int kHd>
__global__ void __launch_bounds__(256)
TensorCoreSliceMergeKernel(const float* __restrict__ qg, int nh, int kvh, const int32_t* __restrict__ items,
                           const int32_t* __restrict__ token_pos, int splits, const float* __restrict__ part_o,
                           const float* __restrict__ part_ml, float* __restrict__ o) {
  PdlWaitForPrevious();  // pdl.cuh: the partials are the step's
  PdlAllowNext();
  constexpr int kLanes = kHd / 4;
  const int item = blockIdx.x, kvhead = blockIdx.y, groups = nh / kvh;
  const int r = blockIdx.z * MergeRowsPerBlock<kHd>() + static_cast<int>(threadIdx.x) / kLanes;
  const int32_t first = items[2 * item], count = items[2 * item + 1];
  if (r >= count * groups) return;
  const TcSlices sl = SlicesOf(token_pos[first + count - 1], splits);
  if (sl.used <= 1) return;
  const int c = threadIdx.x % kLanes;
  const int64_t slot0 = (static_cast<int64_t>(item) * kvh + kvhead) * splits * kTcRows + r;
  float ms[kTcMaxSplits];
  float mm = -INFINITY;
#pragma unroll
  for (int s = 0; s < kTcMaxSplits; ++s) {
    ms[s] = s < sl.used ? part_ml[2 * (slot0 + s * kTcRows)] : -INFINITY;
    mm = fmaxf(mm, ms[s]);
  }
  float ll = 0.0f;
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int s = 0; s < kTcMaxSplits; ++s) {
    if (ms[s] == -INFINITY) continue;  // absent, or every key of the slice lies past this row's position
    const int64_t slot = slot0 + s * kTcRows;
    const float w = exp2f(ms[s] - mm);
    ll = fmaf(w, part_ml[2 * slot + 1], ll);
    const float4 x = reinterpret_cast<const float4*>(part_o + slot * kHd)[c];
    a.x = fmaf(w, x.x, a.x);
    a.y = fmaf(w, x.y, a.y);
    a.z = fmaf(w, x.z, a.z);
    a.w = fmaf(w, x.w, a.w);
  }
  const float inv = 1.0f / ll;
  const int64_t row = QueryRow(first, r / groups, r, groups, nh, kvhead);
  const float* gate = qg + row * 2 * kHd + kHd + 4 * c;
  reinterpret_cast<float4*>(o + row * kHd)[c] =
      make_float4(GatedOutput(a.x * inv, gate[0]), GatedOutput(a.y * inv, gate[1]), GatedOutput(a.z * inv, gate[2]),
                  GatedOutput(a.w * inv, gate[3]));
}

template <int kHd>
cudaError_t LaunchPipelinedHd(const float* q, const float* qg, const AttnShape& d, const int32_t* tile_items,
                              int num_tile_items, const int32_t* token_seq, const int32_t* token_pos,
                              const PagedKv& cache, float* o, cudaStream_t stream, int splits, void* partials) {
  constexpr size_t smem = PipeSmem<kHd>::kBytes;
  // Above 48 KiB a kernel needs the opt-in; done once per instantiation (thread-safe static).
  static const cudaError_t attribute = cudaFuncSetAttribute(
      PipelinedTensorCoreAttentionKernel<kHd>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attribute != cudaSuccess) return attribute;
  const int64_t blocks = static_cast<int64_t>(num_tile_items) * d.kvh * splits;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  float* part_o = static_cast<float*>(partials);
  float* part_ml = splits > 1 ? part_o + blocks * kTcRows * kHd : nullptr;
  cudaError_t e;
  if (const int kv16 = AttnKv16Mode(); kHd == 256 && AttnTcWgmma() && kv16 != 0 && cache.f16_tiles != nullptr) {
    e = LaunchWgmmaKv16Attention256(q, qg, d, tile_items, num_tile_items, static_cast<unsigned>(blocks), token_seq,
                                    token_pos, cache, o, stream, splits, part_o, part_ml, /*overlap=*/kv16 == 2);
  } else if (kHd == 256 && AttnTcWgmma()) {
    e = LaunchWgmmaTensorCoreAttention256(q, qg, d, tile_items, static_cast<unsigned>(blocks), token_seq, token_pos,
                                          cache, o, stream, splits, part_o, part_ml);
  } else {
    e = LaunchPrefillPdl(PipelinedTensorCoreAttentionKernel<kHd>, static_cast<unsigned>(blocks), kPipeThreads, smem,
                         stream, q, qg, d.nh, d.kvh, tile_items, token_seq, token_pos, cache, o, splits, part_o,
                         part_ml);
  }
  if (e != cudaSuccess) return e;
  if (splits > 1) {
    const dim3 grid(static_cast<unsigned>(num_tile_items), static_cast<unsigned>(d.kvh),
                    static_cast<unsigned>(kTcRows / MergeRowsPerBlock<kHd>()));
    return LaunchPrefillPdl(TensorCoreSliceMergeKernel<kHd>, grid, 256, 0, stream, qg, d.nh, d.kvh, tile_items, token_pos,
                            splits, part_o, part_ml, o);
  }
  return cudaSuccess;
}

// On unless TANDEM_ATTN_TC_WGMMA is "0" or "", and only where the sm_90a code runs.
ProcessSwitch g_attn_tc_wgmma{[] { return EnvSwitchDefaultOn("TANDEM_ATTN_TC_WGMMA") && CurrentDeviceRunsSm90a(); }};

// Unset: 2 where the sm_90a code runs (the default since 2026-12-02: H200, 8192 tokens, attention
// kernel 2.25 -> 1.58 ms a layer, end to end +3.0%, docs/PERF.md "Thirteenth session"), else 0.
// Set: 0 where "" or "0"; 2 where "2"; else 1 (any other value turns the f16 tiles on, as the
// boolean switch did).
int AttnKv16FromEnv() {
  if (std::getenv("TANDEM_ATTN_KV16") == nullptr) return CurrentDeviceRunsSm90a() ? 2 : 0;
  return EnvSwitch("TANDEM_ATTN_KV16") ? static_cast<int>(EnvInteger("TANDEM_ATTN_KV16", 1, 1, 2)) : 0;
}

std::atomic<int>& AttnKv16Switch() {
  static std::atomic<int> mode{AttnKv16FromEnv()};
  return mode;
}

}  // namespace

bool AttnKv16() { return AttnKv16Mode() != 0; }
void SetAttnKv16(bool on) { SetAttnKv16Mode(on ? 1 : 0); }
int AttnKv16Mode() { return AttnKv16Switch().load(std::memory_order_relaxed); }
void SetAttnKv16Mode(int mode) { AttnKv16Switch().store(mode >= 0 && mode <= 2 ? mode : 1, std::memory_order_relaxed); }

bool AttnTcWgmma() { return g_attn_tc_wgmma.on(); }
void SetAttnTcWgmma(bool on) { g_attn_tc_wgmma.set(on); }

cudaError_t LaunchTensorCoreAttention(const float* q, const float* qg, const AttnShape& d, const int32_t* tile_items,
                                      int num_tile_items, const int32_t* token_seq, const int32_t* token_pos,
                                      const PagedKv& cache, float* o, cudaStream_t stream, int splits,
                                      void* partials) {
  if (num_tile_items <= 0) return cudaSuccess;
  if (splits < 1 || splits > kTcMaxSplits || (splits > 1 && partials == nullptr)) return cudaErrorInvalidValue;
  switch (d.hd) {
    case 64:
      return LaunchPipelinedHd<64>(q, qg, d, tile_items, num_tile_items, token_seq, token_pos, cache, o, stream,
                                     splits, partials);
    case 128:
      return LaunchPipelinedHd<128>(q, qg, d, tile_items, num_tile_items, token_seq, token_pos, cache, o, stream,
                                     splits, partials);
    case 256:
      return LaunchPipelinedHd<256>(q, qg, d, tile_items, num_tile_items, token_seq, token_pos, cache, o, stream,
                                     splits, partials);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda
