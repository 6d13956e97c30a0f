// The GDN layer's stacked input product inside the fused GDN kernel (gdn_decode_fused_kernel.cuh's
// kIn form, LaunchGdnDecodeLayer in gdn_decode_fused.cuh): each cluster computes the rows of
// [z; qkv; ba] that its key head group reads, from x = γ ⊙ ρ(H + y + g·shared) that every block
// forms itself, before the rest of the layer runs in the same blocks. Device-only; internal
// linkage; included by gdn_decode_fused_kernel.cuh.
//
// Why: at batch-1 decode the product (27 MB of Q8_0x8 on q3n-80b) was its own launch of 264 blocks
// that filled every SM's registers, so the fused GDN kernel's blocks, and their bulk copies of the
// output product's rows, could start only once the product's last block had left: the CUPTI
// timeline had the GDN kernel end 7.2 us after the product, which itself ended 13.6 us after the
// MoE kernel (docs/PERF.md, thirty-first session). Here the input rows stream through a ring of
// bulk copies (the tensor memory accelerator) that the block issues before its PDL wait, with the
// output product's rows asked into L2 beside them (and copied over the ring once the product is
// done), so HBM reads the layer's 40 MB as one stream, and the cluster's rows are ready for the
// conv after one cluster barrier instead of a grid boundary. (Measured slower end to end: the
// switch is off, docs/PERF.md "Thirty-third session".)
//
// The rows a cluster computes (the key head group g of r = nv/nk value heads; [z; qkv; ba] stacked
// in that order, qkv = [q heads; k heads; v heads], ba grouped by key head as [b_0..b_{r-1},
// a_0..a_{r-1}]): z rows g·r·dv + [0, r·dv), q rows g·dk + [0, dk), k rows nk·dk + g·dk + [0, dk),
// v rows 2nk·dk + g·r·dv + [0, r·dv) (qkv's offsets from its first row), ba rows 2r·g + [0, 2r):
// exactly the values the fused kernel reads for the group, so no cluster reads another's rows.
// Each section is cut into chunks of kInChunkRows rows (one bulk copy each: a section's rows are
// contiguous), dealt to the cluster's blocks in turn.
//
// The product: x quantized to int16 with one scale per Q8_0 block of 32 (q8x8_columns.cuh's
// QuantizeColumnI16), dp2a against the int8 quants, one f32 scale product a block, a warp a row
// (lane l: the Q8_0 blocks l, l + 32, ..., whose activations it keeps in registers), the warp's
// butterfly. The fast mode's rounding (~1e-5 relative a row), not the streaming kernel's bits.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_IN_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_IN_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gpu_service/backends/cuda/kernels/norm_row.cuh"
#include "gpu_service/backends/cuda/kernels/q8x8_columns.cuh"
#include "gpu_service/backends/cuda/mbarrier.cuh"

namespace tandem::cuda {
namespace {

constexpr int kInChunkRows = 8;      // rows of one bulk copy (a warp a row: the block's 8 warps)
constexpr int kInMaxSlots = 8;       // ring slots (mbarriers in static shared memory)
constexpr int kInMaxCols = 2048;     // x in registers: at most two Q8_0 blocks a lane
constexpr int kInLaneBlocks = kInMaxCols / 32 / 32;

// Dynamic shared memory of the kIn form past `base` (the output product's gathered outputs; offsets
// 16-byte aligned): the ring, then the norm's area (H, γ, y, shared: cols floats each; x is formed
// over H), then x as int16 and its scales (one a Q8_0 block). Once the product is done, ssm_out's
// rows are copied over the ring, the area and x's int16.
struct InLayout {
  int ring, area, xq, xscale, end;
};
__host__ __device__ inline InLayout InSharedLayout(int base, int64_t row_bytes, int slots, int cols) {
  InLayout l{};
  l.ring = (base + 15) / 16 * 16;
  l.area = l.ring + slots * kInChunkRows * static_cast<int>(row_bytes);
  l.xq = l.area + 4 * cols * static_cast<int>(sizeof(float));
  l.xscale = l.xq + (cols * static_cast<int>(sizeof(int16_t)) + 15) / 16 * 16;
  l.end = l.xscale + cols / 32 * static_cast<int>(sizeof(float));
  return l;
}

// What the kIn kernel reads for its product (set by LaunchGdnDecodeLayer).
struct GdnInProduct {
  const uint8_t* w = nullptr;  // the stacked [z; qkv; ba] rows, Q8_0x8
  int64_t row_bytes = 0;
  int cols = 0;
  int qkv_row0 = 0, ba_row0 = 0;  // where qkv's and ba's rows start in the stack (z's at 0)
  float* rows = nullptr;          // the product's outputs, one float a stacked row
  int slots = 0;                  // ring slots of kInChunkRows · row_bytes bytes
  // x = γ ⊙ ρ(H + y + g·shared) (dense_matvec.cuh MatVecNormIn).
  const float* H = nullptr;
  const float* y = nullptr;
  const float* shared = nullptr;
  const float* gate_logit = nullptr;
  const float* gamma = nullptr;
  float eps = 0.0f;
  bool h_early = false;  // H's writer is two or more launches back: copied before the PDL wait
  int norm_vec = 0, norm_threads = 0;  // norm_row::RegSplitFor(cols / 4)
  InLayout smem{};                     // the offsets above (InSharedLayout)
  // Diagnosis (GdnDecodeIn::probe): thread 0 of each block writes %globaltimer at kInProbePhases
  // phases into its row of kInProbePhases words (block (x, y) at row y·gridDim.x + x).
  unsigned long long* probe = nullptr;
};

__device__ __forceinline__ void InStamp(const GdnInProduct& in, int tid, int phase) {
  if (in.probe != nullptr && tid == 0) {
    in.probe[(static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * kInProbePhases + phase] = GlobalTimerNs();
  }
}

// Chunk j of group g's rows: {first stacked row, rows}; rows 0 past the last chunk.
struct InChunk {
  int row0, rows;
};
__device__ __forceinline__ InChunk InChunkOf(const GdnInProduct& in, int j, int g, int nk, int r, int dk, int dv) {
  const int starts[5] = {g * r * dv, in.qkv_row0 + g * dk, in.qkv_row0 + nk * dk + g * dk,
                         in.qkv_row0 + 2 * nk * dk + g * r * dv, in.ba_row0 + 2 * r * g};
  const int counts[5] = {r * dv, dk, dk, r * dv, 2 * r};
#pragma unroll
  for (int s = 0; s < 5; ++s) {
    const int n = (counts[s] + kInChunkRows - 1) / kInChunkRows;
    if (j < n) {
      const int left = counts[s] - j * kInChunkRows;
      return {starts[s] + j * kInChunkRows, left < kInChunkRows ? left : kInChunkRows};
    }
    j -= n;
  }
  return {0, 0};
}
__host__ __device__ inline int InChunks(int r, int dk, int dv) {
  auto chunks = [](int n) { return (n + kInChunkRows - 1) / kInChunkRows; };
  return 2 * chunks(r * dv) + 2 * chunks(dk) + chunks(2 * r);
}

// Thread 0: chunk i of this block (the cluster's chunk rank + i·cluster) into ring slot i % slots,
// completing that slot's barrier by its bytes.
__device__ __forceinline__ void IssueInChunk(const GdnInProduct& in, int i, int rank, int cluster, int g, int nk,
                                             int r, int dk, int dv, uint32_t ring, uint32_t bar0) {
  const InChunk c = InChunkOf(in, rank + i * cluster, g, nk, r, dk, dv);
  const int slot = i % in.slots;
  const uint32_t bytes = static_cast<uint32_t>(c.rows * in.row_bytes);
  const uint32_t bar = bar0 + 8u * static_cast<uint32_t>(slot);
  mbarrier::ArriveExpectTx(bar, bytes);
  mbarrier::BulkCopyToShared(ring + static_cast<uint32_t>(slot * kInChunkRows * in.row_bytes),
                             in.w + static_cast<int64_t>(c.row0) * in.row_bytes, bytes, bar);
}

// The norm's copies into its area (H at area, γ at + cols, y at + 2cols, shared at + 3cols; float4
// i by thread i % threads of the norm's split, as the register norm kernel reads them).
__device__ __forceinline__ void InNormCopy(float4* dst, const float* src, const GdnInProduct& in, int tid) {
  if (tid >= in.norm_threads) return;
  const int h4 = in.cols / 4;
  for (int k = 0; k < in.norm_vec; ++k) {
    const int i = tid + k * in.norm_threads;
    if (i >= h4) break;
    CpAsync16(static_cast<uint32_t>(__cvta_generic_to_shared(dst + i)), src + 4 * static_cast<int64_t>(i));
  }
}

// Before the wait: γ, and H when its writer is two or more launches back.
__device__ __forceinline__ void InNormEarlyCopies(const GdnInProduct& in, float4* area, int tid) {
  const int h4 = in.cols / 4;
  InNormCopy(area + h4, in.gamma, in, tid);
  if (in.h_early) InNormCopy(area, in.H, in, tid);
  CpAsyncCommit();
}

// After the wait: x = γ ⊙ ρ(H + y + g·shared) over H's place in the area, with the register norm
// kernel's operations (norm_row.cuh; the block sum over this kernel's 8 warps), then x as int16
// (QuantizeColumnI16, 256 columns a round). Every thread of the block (256) calls it. The steps of
// matvec_stream_norm_in.cuh's NormInStage, written again for this kernel's (32, 8) block: that one
// indexes threads by threadIdx.x and sums with BlockSum over blockDim.x.
__device__ __forceinline__ void InFormX(const GdnInProduct& in, float4* area, int16_t* xq, float* xscale, int tid,
                                        int lane, int warp) {
  __shared__ float scratch[32];
  const int h4 = in.cols / 4;
  float4 *hs = area, *gs = area + h4, *ys = area + 2 * h4, *ss4 = area + 3 * h4;
  if (!in.h_early) InNormCopy(hs, in.H, in, tid);
  if (in.y != nullptr) InNormCopy(ys, in.y, in, tid);
  const bool with_shared = in.y != nullptr && in.shared != nullptr;
  if (with_shared) InNormCopy(ss4, in.shared, in, tid);
  CpAsyncCommit();
  const float g = with_shared ? norm_row::SharedGate(in.gate_logit, 0) : 1.0f;
  CpAsyncWait<0>();
  const bool mine = tid < in.norm_threads;
  float ss = 0.0f;
  if (mine) {
    for (int k = 0; k < in.norm_vec; ++k) {
      const int i = tid + k * in.norm_threads;
      if (i >= h4) break;
      float4 v = hs[i];
      if (in.y != nullptr) {
        float4 d = ys[i];
        if (with_shared) d = norm_row::AddShared(d, g, ss4[i]);
        v = norm_row::InjectQuad(v, 1.0f, d);
      }
      hs[i] = v;
      ss = norm_row::AddSquares(ss, v);
    }
  }
  // BlockSum over the (32, 8) block: the warps' sums, then lanes < 8 add them.
  ss = WarpSum(ss);
  if (lane == 0) scratch[warp] = ss;
  __syncthreads();
  ss = WarpSum(lane < 8 ? scratch[lane] : 0.0f);
  const float scale = norm_row::RmsScale(ss, in.cols, in.eps);
  if (mine) {
    for (int k = 0; k < in.norm_vec; ++k) {
      const int i = tid + k * in.norm_threads;
      if (i >= h4) break;
      hs[i] = norm_row::NormQuad(gs[i], hs[i], scale);
    }
  }
  __syncthreads();
  const float* x = reinterpret_cast<const float*>(hs);
  for (int c0 = 0; c0 < in.cols; c0 += 256) QuantizeColumnI16(x[c0 + tid], tid, lane, warp, xq + c0, xscale + c0 / 32);
  __syncthreads();
}

// The activations of lane `lane`'s Q8_0 blocks (b = lane + 32j < cols / 32) in registers.
struct InLaneX {
  uint4 x[kInLaneBlocks][4];  // 32 int16 a block
  float scale[kInLaneBlocks];
};
__device__ __forceinline__ void LoadInLaneX(const int16_t* xq, const float* xscale, int cols, int lane, InLaneX& lx) {
#pragma unroll
  for (int j = 0; j < kInLaneBlocks; ++j) {
    const int b = lane + 32 * j;
    const bool has = b < cols / 32;
#pragma unroll
    for (int q = 0; q < 4; ++q) lx.x[j][q] = has ? reinterpret_cast<const uint4*>(xq + 32 * b)[q] : make_uint4(0, 0, 0, 0);
    lx.scale[j] = has ? xscale[b] : 0.0f;
  }
}

// One row (in shared memory, Q8_0x8) times x, summed over the warp: every lane returns it.
__device__ __forceinline__ float InRowDot(const uint8_t* row, const InLaneX& lx, int cols, int lane) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kInLaneBlocks; ++j) {
    const int b = lane + 32 * j;
    if (b < cols / 32) {
      const uint8_t* sb = row + (b >> 3) * kColumnSuperBytes;
      const uint4* q = reinterpret_cast<const uint4*>(sb + 16 + 32 * (b & 7));
      int s = 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) s = Dp2aSixteen(s, q[half], lx.x[j][2 * half], lx.x[j][2 * half + 1]);
      const float d = __half2float(*reinterpret_cast<const __half*>(sb + 2 * (b & 7)));
      acc = fmaf(static_cast<float>(s), d * lx.scale[j], acc);
    }
  }
  return WarpSum(acc);
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_IN_CUH_
