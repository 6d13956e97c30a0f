// Activations of the one-token MoE kernels (expert_decode_one.cu) in shared memory: a row staged
// as f32 super-blocks padded to kXSbStride with its sub-block sums (the f32 products), or quantized
// to int16 per super-block, padded to kXqSbStride, with its scales and f32 sub-block sums (the
// fast mode's dp2a products, q4k_dot.cuh's DotSuperBlockI16). Device code only (include from .cu
// files); internal linkage, as in matvec_core.cuh.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ONE_TOKEN_ACT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ONE_TOKEN_ACT_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/moe/q4k_dot.cuh"

namespace tandem::cuda {
namespace {

using q4k::I16Inverse;
using q4k::I16Scale;
using q4k::kXSbStride;
using q4k::MaxAbs4;
using q4k::PackI16x8;

// Stages `cols` activations from global `src` into xs (super-blocks padded to kXSbStride) with
// threads [t0, t0 + nt) of the block. Read through L2 (__ldcg), as StageQuantizeI16: the down
// kernel may read act rows that other blocks of a running grid wrote (OneTokenMoeArgs::pick_counts),
// and this SM's L1 may hold the previous layer's.
__device__ __forceinline__ void StageRow(const float* src, int cols, float* xs, int t, int t0, int nt) {
  const float4* xr = reinterpret_cast<const float4*>(src);
  for (int qd = t - t0; qd < (cols >> 2); qd += nt) {
    const int e = 4 * qd;
    *reinterpret_cast<float4*>(xs + (e >> 8) * kXSbStride + (e & 255)) = __ldcg(xr + qd);
  }
}

// Sub-block sums of a staged row (the tile kernel's order): sxs[sb · 8 + j] for nsb super-blocks.
__device__ __forceinline__ void SubBlockSums(const float* xs, int nsb, float* sxs, int t, int nt) {
  for (int i = t; i < nsb * 8; i += nt) sxs[i] = q4k::StagedSubBlockSum(xs, i);
}

// int16 activations in shared memory: super-block sb at xq + kXqSbStride·sb. The padding keeps the
// lanes of one row (one super-block each, reading at the same offset) on distinct banks, as
// kXSbStride does for f32 (256 int16 would put all eight 512 bytes apart: an 8-way conflict).
constexpr int kXqSbStride = 264;

// int16 activations (q4k_dot.cuh's DotSuperBlockI16): a row of nsb super-blocks read from global
// src (contiguous) quantized per super-block into xq[kXqSbStride·sb + i] and xsc[sb], with its f32
// sub-block sums sxs[8·sb + j]. Warp w of nw takes super-blocks w, w + nw, ...; lane l eight
// elements.
__device__ __forceinline__ void QuantizeI16(const float* src, int nsb, int16_t* xq, float* xsc, float* sxs, int w,
                                            int nw, int lane) {
  for (int sb = w; sb < nsb; sb += nw) {
    const float4* p = reinterpret_cast<const float4*>(src + sb * 256 + 8 * lane);
    const float4 u = p[0], v = p[1];
    float mx = fmaxf(MaxAbs4(u), MaxAbs4(v));
    float s = ((u.x + u.y) + (u.z + u.w)) + ((v.x + v.y) + (v.z + v.w));
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);  // four lanes hold a sub-block of 32
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 2);
    *reinterpret_cast<uint4*>(xq + sb * kXqSbStride + 8 * lane) = PackI16x8(u, v, I16Inverse(mx));
    if ((lane & 3) == 0) sxs[sb * 8 + (lane >> 2)] = s;
    if (lane == 0) xsc[sb] = I16Scale(mx);
  }
}

// int16 activations, one warp: `cols` f32 activations read from global src (through L2), quantized per
// super-block into xq / xsc with their f32 sub-block sums sxs (as QuantizeI16). Lane l
// takes 16 elements of each 512.
__device__ __forceinline__ void StageQuantizeI16(const float* src, int cols, int16_t* xq, float* xsc, float* sxs,
                                                 int lane) {
  for (int c0 = 0; c0 < cols; c0 += 512) {
    const int c = c0 + 16 * lane;
    const bool in = c < cols;  // cols is a multiple of 256: a half-warp is in or out
    float4 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = in ? __ldcg(reinterpret_cast<const float4*>(src + c) + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    float mx = 0.0f, s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      mx = fmaxf(mx, MaxAbs4(v[i]));
      s += (v[i].x + v[i].y) + (v[i].z + v[i].w);
    }
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);  // two lanes hold a sub-block of 32
    for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));  // 16 a super-block
    if (in) {
      const float inv = I16Inverse(mx);
      uint4* dst = reinterpret_cast<uint4*>(xq + (c >> 8) * kXqSbStride + (c & 255));
      dst[0] = PackI16x8(v[0], v[1], inv);
      dst[1] = PackI16x8(v[2], v[3], inv);
      if ((lane & 1) == 0) sxs[c >> 5] = s;
      if ((lane & 15) == 0) xsc[c >> 8] = I16Scale(mx);
    }
  }
}

// One warp's gate and up rows from row0 on (row_bytes each, `chunks` 16-byte pieces a matrix) into
// shared memory, gate at dst and up at dst + up_offset, by cp.async (lane l pieces l, l + 32, ...),
// committed as one group.
__device__ __forceinline__ void WarpCopyGateUpRows(uint8_t* dst, int up_offset, const void* gate, const void* up,
                                                   int row0, int row_bytes, int chunks, int lane) {
  const uint8_t* g = static_cast<const uint8_t*>(gate) + static_cast<int64_t>(row0) * row_bytes;
  const uint8_t* u = static_cast<const uint8_t*>(up) + static_cast<int64_t>(row0) * row_bytes;
  for (int c = lane; c < chunks; c += 32) {
    q4k::CpAsync16(dst + 16 * c, g + 16 * c);
    q4k::CpAsync16(dst + up_offset + 16 * c, u + 16 * c);
  }
  CpAsyncCommit();
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ONE_TOKEN_ACT_CUH_
