// The fused GDN decode kernel's per-thread pieces (gdn_decode_fused_kernel.cuh), each written with the
// operations, in the order, of the kernel it stands for, so that the fused kernel's outputs, conv
// history and state are the same bits as the four-kernel path's: a channel's conv over its history
// (GdnConvKernel, gdn.cu), the sums of squares of the q/k norms and the gated norm
// (gdn_tokens.cu), and a value of the stacked input product read as it lands (polled rows). Device
// code only (include from .cu files); internal linkage, as in matvec_core.cuh.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_PARTS_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_PARTS_CUH_

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/load_acquire.cuh"
#include "gpu_service/backends/cuda/spin_wait.cuh"

namespace tandem::cuda {
namespace {

constexpr int kGdnDecodeBlockCols = 32;  // value columns a block of the fused kernel (a lane each)

// The sums of squares of four values, with the fma contraction of the kernel each replaces pinned.
// gdn_tokens.cu writes v.x·v.x + v.y·v.y + v.z·v.z + v.w·v.w and leaves the contraction to the
// compiler, which (CUDA 13.0, sm_90a, checked in the PTX) rounds a different product first in
// different kernels: GdnNormQkVecKernel<1> (LaunchGdnPrepare below kGdnPrepareShortRunBelow tokens)
// rounds v.x·v.x and fuses v.y·v.y into it (SumSquaresXFirst); GdnNormQkVecKernel<8> (from that
// many tokens on) and GdnGatedNormVecKernel round v.y·v.y and fuse v.x·v.x (SumSquaresYFirst).
// The same expression here had compiled to the second form in the q/k norms, so the sums differed
// in the last place now and then, and with them q, k, o and the states (the first device run,
// 2026-12-01). Explicit roundings and fmaf leave the compiler nothing to choose; the test
// (gdn_decode_fused_test.cc) compares the bits with the four kernels at both batch ranges.
__device__ __forceinline__ float SumSquaresXFirst(float4 v) {
  return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, __fmul_rn(v.x, v.x))));
}
__device__ __forceinline__ float SumSquaresYFirst(float4 v) {
  return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.x, v.x, __fmul_rn(v.y, v.y))));
}

// gdn_tokens.cu's butterfly: every lane of a group ends with the same sum (each step adds the same
// two values on both lanes, a + b = b + a exactly).
__device__ __forceinline__ float GroupSum(float v, int group_lanes) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    if (o < group_lanes) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  }
  return v;
}

// The gated norm's scale ρ = 1/√(mean of squares + eps) of value head `head` (cluster rank head + y·r
// holds its columns 32y ..), from its blocks' sq_part (4 outputs' squares each), for a warp holding
// 32 of its columns: lane l takes GdnGatedNormVecKernel's lane l of the head's dv/4-lane group
// (block l / 8), so the sum has that kernel's bits. The sum ends in lanes [0, dv/4) only: with dv <
// 128 the butterfly stays inside groups of dv/4 lanes, and the lanes past the first group, whose p
// is 0, summed to 0 (scale rsqrt(eps): the wrong gated outputs of dv 32 and 64 on the first device
// run); lane 0's sum goes to all 32 lanes.
// kGathered: the cluster's parts are already in this block's shared memory (rank q's at
// sq_part + q · kPartsPerBlock, pushed there by every block) rather than read from each block's.
template <bool kGathered = false>
__device__ __forceinline__ float HeadRmsScale(float* sq_part, int head, int r, int dv, int lane, float eps) {
  constexpr int kPartsPerBlock = kGdnDecodeBlockCols / 4;  // a block's columns, 4 a part
  const int head_lanes = dv / 4;
  float p = 0.0f;
  if (lane < head_lanes) {
    const unsigned rank = static_cast<unsigned>(head + (lane / kPartsPerBlock) * r);
    p = kGathered ? sq_part[rank * kPartsPerBlock + lane % kPartsPerBlock]
                  : cooperative_groups::this_cluster().map_shared_rank(sq_part, rank)[lane % kPartsPerBlock];
  }
  const float ss = __shfl_sync(0xFFFFFFFFu, GroupSum(p, head_lanes), 0);
  return rsqrtf(ss / static_cast<float>(dv) + eps);
}

// A value of the stacked product's rows: through L2 (another grid wrote it; this SM's L1 may hold
// an earlier layer's row at the same address), or, with polled rows (GdnDecodeFusedArgs::
// rows_polled), by device-scope relaxed loads until it is written. A value never written traps
// (spin_wait.cuh): a launch error, not a hang.
__device__ __forceinline__ float ReadRow(const float* p, bool polled) {
  if (!polled) return __ldcg(p);
  unsigned bits;
  SpinUntil<32>([&] { return (bits = LoadRelaxed(reinterpret_cast<const unsigned*>(p))) != kRowUnwrittenBits; });
  return __uint_as_float(bits);
}

// Channel c's taps (a constant weight: read before the PDL wait); unused taps, and all of a thread
// without the channel (valid false), 0. Written unconditionally so that the arrays stay in registers.
// `last` is tap kk − 1 once more, loaded by itself: selecting w[kk − 1] in an unrolled loop was
// folded by the compiler into a dynamically indexed array in local memory.
__device__ __forceinline__ void LoadTaps(const float* taps, bool valid, int c, int kk, float (&w)[kGdnMaxConvKernel],
                                         float& last) {
#pragma unroll
  for (int q = 0; q < kGdnMaxConvKernel; ++q) w[q] = valid && q < kk ? taps[static_cast<int64_t>(c) * kk + q] : 0.0f;
  last = valid ? taps[static_cast<int64_t>(c) * kk + kk - 1] : 0.0f;
}

// GdnConvKernel's operations for one token of channel c: returns SiLU(conv), with h the channel's
// old history (kk − 1 inputs, oldest first) and x its input, which StoreHistory shifts into the new
// history. A thread without the channel (valid false) reads nothing and gets zeros. (No shifted
// window array as in GdnConvKernel: its conditional shift over a runtime kk compiled to a loop
// over local memory.)
// The channel's last kk − 1 inputs (earlier steps' history rows), read before the token's x.
__device__ __forceinline__ void LoadHistory(float (&h)[kGdnMaxConvKernel], const float* history, bool valid, int c_dim,
                                            int c, int kk) {
#pragma unroll
  for (int q = 0; q < kGdnMaxConvKernel; ++q) {
    h[q] = valid && q < kk - 1 ? history[static_cast<int64_t>(q) * c_dim + c] : 0.0f;
  }
}

__device__ __forceinline__ float ConvToken(const float (&w)[kGdnMaxConvKernel], float last,
                                           const float (&h)[kGdnMaxConvKernel], float& x, const float* x_row,
                                           bool valid, int c, int kk, bool polled) {
  x = valid ? ReadRow(x_row + c, polled) : 0.0f;
  float sum = 0.0f;
#pragma unroll
  for (int q = 0; q < kGdnMaxConvKernel; ++q) {
    if (q < kk - 1) sum = fmaf(w[q], h[q], sum);
  }
  sum = fmaf(last, x, sum);
  return SiluF(sum);
}

// history ← the last kk − 1 inputs: old rows 1.. kk − 2, then x.
__device__ __forceinline__ void StoreHistory(const float (&h)[kGdnMaxConvKernel], float x, float* history, int c_dim,
                                             int c, int kk) {
#pragma unroll
  for (int q = 0; q + 1 < kGdnMaxConvKernel; ++q) {
    if (q < kk - 1) history[static_cast<int64_t>(q) * c_dim + c] = q == kk - 2 ? x : h[q + 1];
  }
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_PARTS_CUH_
