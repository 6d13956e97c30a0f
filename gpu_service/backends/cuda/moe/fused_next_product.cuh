// The next mixer's input product as the last phase of the fused one-token MoE kernel
// (expert_decode_fused.cuh FusedNextProduct says what and why). Device-only; internal linkage;
// include from expert_decode_fused.cu.
//
// A block of the grid (kThreads = 128 threads), once its share of the MoE is added into y:
//   1. counts itself done (a fence, then an atomic: release), copies the first of its product rows
//      into the shared memory its expert rows held (as many as fit) and asks L2 for the rest's lines;
//   2. loads H and γ into registers, waits until every expert block has counted (acquire), reads y
//      from L2 and forms x = γ ⊙ ρ(H + y) with the register norm kernel's split and sums (the same
//      bits as the norm-in product's x: norm_row.cuh; thread t holds the float4s t + 128j and
//      stands in for the norm kernel's threads t and t + 128), quantized to int16 with one scale a
//      Q8_0 block of 32 (QuantizeColumnI16's expression);
//   3. a warp a row: out[r] = row_r · x (q8x8_columns.cuh's RowDotQ8x8), first the rows in shared
//      memory, then the rest copied over them.
// Block b of n takes rows [b·rows / n, (b + 1)·rows / n).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_FUSED_NEXT_PRODUCT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_FUSED_NEXT_PRODUCT_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/norm_row.cuh"
#include "gpu_service/backends/cuda/kernels/q8x8_columns.cuh"
#include "gpu_service/backends/cuda/load_acquire.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kNextThreads = 128;                      // the fused kernel's block
constexpr int kNextVecs = kRowDotMaxCols / 4 / kNextThreads;  // float4s of x a thread holds (4)
// A spin wait longer than this is a bug (an expert block that never counted): trap rather than hang.
constexpr unsigned long long kNextWaitTimeoutNs = 2'000'000'000ull;

// Where the phase may put things in the block's shared memory: `rows` (cap_rows rows of
// np.row_bytes, 16-byte aligned), x as int16 (cols) and its scales (cols / 32 floats).
struct NextProductSmem {
  uint8_t* rows;
  int cap_rows;
  int16_t* xq;
  float* xscale;
};

// Asks L2 for the 128-byte line holding p (no copy engine, nothing to wait for).
__device__ __forceinline__ void PrefetchLineL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// 16-byte copies of `bytes` (a multiple of 16) from src into shared memory at dst, one commit group.
__device__ __forceinline__ void CopyRowsToShared(uint8_t* dst, const uint8_t* src, int64_t bytes, int tid) {
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  for (int64_t i = tid; i < bytes / 16; i += kNextThreads) CpAsync16(base + static_cast<uint32_t>(16 * i), src + 16 * i);
  CpAsyncCommit();
}

// Rows [r0, r0 + n) in shared memory (at s.rows) times x: a warp a row.
__device__ __forceinline__ void NextRowDots(const FusedNextProduct& np, const NextProductSmem& s, const LaneX& lx,
                                            int r0, int n, int warp, int lane) {
  for (int i = warp; i < n; i += kNextThreads / 32) {
    const float v = RowDotQ8x8(s.rows + static_cast<int64_t>(i) * np.row_bytes, lx, np.cols, lane);
    if (lane == 0) np.out[r0 + i] = v;
  }
}

// The phase; every thread of the block calls it after its additions into y are issued. y: the
// kernel's y (complete once every one of the `blocks` expert blocks has counted).
__device__ __forceinline__ void NextProductPhase(const FusedNextProduct& np, const float* y, const NextProductSmem& s,
                                                 int block, int blocks) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  __shared__ float scratch[8];
  const int r0 = static_cast<int>(static_cast<int64_t>(block) * np.rows / blocks);
  const int r1 = static_cast<int>(static_cast<int64_t>(block + 1) * np.rows / blocks);
  const int n = r1 - r0, first = n < s.cap_rows ? n : s.cap_rows;
  const uint8_t* src = static_cast<const uint8_t*>(np.w) + static_cast<int64_t>(r0) * np.row_bytes;

  // 1. This block's share of y is issued (every thread's atomics, before the barrier): release it.
  // The barrier also ends every read of the expert rows' shared memory.
  __syncthreads();
  if (t == 0) {
    __threadfence();
    atomicAdd(np.counters, 1);
  }
  if (!np.copy_after_count) CopyRowsToShared(s.rows, src, static_cast<int64_t>(first) * np.row_bytes, t);
  // The rest into L2, a 128-byte line an instruction (the copy engine's bulk prefetches of whole
  // rows measured far slower here: docs/PERF.md, thirty-fourth session).
  {
    const uint8_t* rest = src + static_cast<int64_t>(first) * np.row_bytes;
    const int64_t lines = (static_cast<int64_t>(n - first) * np.row_bytes + 127) / 128;
    for (int64_t i = t; i < lines && !np.copy_after_count; i += kNextThreads) PrefetchLineL2(rest + 128 * i);
  }

  // 2. H and γ now (H's writer is the launch before this grid, complete at its PDL wait), y once
  // every expert block has counted.
  const int h4 = np.cols / 4;
  float4 hv[kNextVecs], gv[kNextVecs];
#pragma unroll
  for (int j = 0; j < kNextVecs; ++j) {
    const int i = t + kNextThreads * j;
    if (i < h4) {
      hv[j] = __ldcg(reinterpret_cast<const float4*>(np.H) + i);
      gv[j] = __ldg(reinterpret_cast<const float4*>(np.gamma) + i);
    }
  }
  if (t == 0 && LoadAcquire(np.counters) < blocks) {
    const unsigned long long start = GlobalTimerNs();
    while (LoadAcquire(np.counters) < blocks) {
      __nanosleep(static_cast<unsigned>(np.poll_ns));
      if (GlobalTimerNs() - start > kNextWaitTimeoutNs) __trap();
    }
  }
  __syncthreads();
  if (np.copy_after_count) {
    CopyRowsToShared(s.rows, src, static_cast<int64_t>(first) * np.row_bytes, t);
    const uint8_t* rest = src + static_cast<int64_t>(first) * np.row_bytes;
    const int64_t lines = (static_cast<int64_t>(n - first) * np.row_bytes + 127) / 128;
    for (int64_t i = t; i < lines; i += kNextThreads) PrefetchLineL2(rest + 128 * i);
  }
  if (np.allow_next == FusedNextProduct::kAllowAfterCount) PdlAllowNext();
  if (t == 0 && atomicAdd(np.counters + 1, 1) == blocks - 1) {
    // Every expert block has seen the count complete: zero both for the next launch.
    np.counters[0] = 0;
    np.counters[1] = 0;
  }
#pragma unroll
  for (int j = 0; j < kNextVecs; ++j) {
    const int i = t + kNextThreads * j;
    if (i < h4) hv[j] = norm_row::InjectQuad(hv[j], 1.0f, __ldcg(reinterpret_cast<const float4*>(y) + i));
  }
  // The norm kernel's split (norm_row::RegSplitFor): norm thread v sums its float4s v, v + threads,
  // ... in that order; this thread is norm thread t (and t + 128 when the split has 256 threads).
  const norm_row::RegSplit split = norm_row::RegSplitFor(h4);
  float ss[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < kNextVecs; ++j) {
    const int i = t + kNextThreads * j;
    const int v = split.threads == 256 ? j & 1 : 0;  // which of this thread's norm threads owns float4 i
    if (i < h4) ss[v] = norm_row::AddSquares(ss[v], hv[j]);
  }
  // BlockSum over the norm kernel's warps: warp w's sum, then w + 4's (the 256-thread split).
  const float w0 = WarpSum(ss[0]), w1 = WarpSum(ss[1]);
  if (lane == 0) {
    scratch[warp] = w0;
    scratch[warp + 4] = w1;
  }
  __syncthreads();
  const int norm_warps = split.threads / 32;
  const float total = WarpSum(lane < norm_warps ? scratch[lane] : 0.0f);
  const float scale = norm_row::RmsScale(total, np.cols, np.eps);
  // x as int16: float4 i holds columns 4i .. 4i + 3, so a Q8_0 block of 32 is 8 lanes' float4s.
#pragma unroll
  for (int j = 0; j < kNextVecs; ++j) {
    const int i = t + kNextThreads * j;
    if (i < h4) {  // warp-uniform (h4 is a multiple of 64)
      const float4 x = norm_row::NormQuad(gv[j], hv[j], scale);
      float m = fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w)));
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
      const float inv = m > 0.0f ? 32767.0f / m : 0.0f;
      short4 q;
      q.x = static_cast<short>(__float2int_rn(x.x * inv));
      q.y = static_cast<short>(__float2int_rn(x.y * inv));
      q.z = static_cast<short>(__float2int_rn(x.z * inv));
      q.w = static_cast<short>(__float2int_rn(x.w * inv));
      reinterpret_cast<short4*>(s.xq)[i] = q;
      if ((lane & 7) == 0) s.xscale[i >> 3] = m * (1.0f / 32767.0f);
    }
  }
  __syncthreads();
  LaneX lx;
  LoadLaneX(s.xq, s.xscale, np.cols, lane, lx);

  // 3. The rows: those in shared memory, then the rest over them.
  CpAsyncWait<0>();
  __syncthreads();
  NextRowDots(np, s, lx, r0, first, warp, lane);
  for (int done = first; done < n;) {
    const int next = n - done < s.cap_rows ? n - done : s.cap_rows;
    __syncthreads();  // every warp is done with the rows there
    CopyRowsToShared(s.rows, src + static_cast<int64_t>(done) * np.row_bytes, static_cast<int64_t>(next) * np.row_bytes, t);
    CpAsyncWait<0>();
    __syncthreads();
    NextRowDots(np, s, lx, r0 + done, next, warp, lane);
    done += next;
  }
  if (np.allow_next == FusedNextProduct::kAllowAtEnd) PdlAllowNext();
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_FUSED_NEXT_PRODUCT_CUH_
