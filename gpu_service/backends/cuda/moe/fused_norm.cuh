// The RMS norm before the MoE computed inside the fused one-token MoE kernel (FusedNorm,
// expert_decode_fused.cuh): its router blocks form x = γ ⊙ ρ(H + y) themselves from the residual
// row H, the mixer's output y (the launch just before) and the norm's weights γ, so that the layer
// has no norm launch between the mixer and the MoE (~2 us of launch, wait and one-block tail a
// layer, PERF.md "what each piece costs the step"). Each router block reads 24 KB from L2 for it
// (h 2048); the expert blocks copy the first router block's quantized x instead of forming it
// (448 blocks reading the same 24 KB at the same moment measured slower than the norm's launch).
//
// A row of h = 256 .. 2048 floats is held by the 4 warps of a block in QuantizeI16's layout: warp w
// the super-blocks w and w + 4, lane l elements 8l .. 8l + 7 of each (two float4, u and v), so the
// normalized row is quantized from registers. The per-value operations are
// InjectRmsNormRegKernel's (v = H + 1·y; r = γ·(v·scale), scale = rsqrt(Σv²/h + ε)); only the
// order of the sum of squares differs (fast mode), and it is the same in every router block.
//
// Device code only (include from .cu files); internal linkage, as in matvec_core.cuh.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_FUSED_NORM_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_FUSED_NORM_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/moe/one_token_act.cuh"

namespace tandem::cuda {
namespace {

constexpr int kNormWarps = 4;  // the fused kernel's warps a block

// A block's share of one row (see above); the super-blocks past nsb hold zeros.
struct NormRow {
  float4 u[2], v[2];
};

// Reads the row's elements of this thread through L2 (the writers are other grids; this SM's L1
// may hold lines of the same addresses from an earlier layer).
__device__ __forceinline__ NormRow LoadNormRow(const float* src, int nsb, int warp, int lane) {
  NormRow r;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int sb = warp + kNormWarps * j;
    const bool in = sb < nsb;
    const float4* p = reinterpret_cast<const float4*>(src + sb * 256 + 8 * lane);
    r.u[j] = in ? __ldcg(p) : make_float4(0.f, 0.f, 0.f, 0.f);
    r.v[j] = in ? __ldcg(p + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  return r;
}

__device__ __forceinline__ float4 Add4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }
__device__ __forceinline__ float Sq4(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
__device__ __forceinline__ float4 Scale4(float4 g, float4 v, float scale) {
  return make_float4(g.x * (v.x * scale), g.y * (v.y * scale), g.z * (v.z * scale), g.w * (v.w * scale));
}

// x ← γ ⊙ ρ(x + y), x entering as the residual row H. Every thread of the block calls it once
// (one __syncthreads); `scratch` holds kNormWarps floats of shared memory.
__device__ __forceinline__ void NormalizeRow(NormRow& x, const NormRow& y, const NormRow& gamma, int h, float eps,
                                             float* scratch, int warp, int lane) {
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    x.u[j] = Add4(x.u[j], y.u[j]);
    x.v[j] = Add4(x.v[j], y.v[j]);
    ss += Sq4(x.u[j]) + Sq4(x.v[j]);
  }
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, off);
  if (lane == 0) scratch[warp] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kNormWarps; ++w) total += scratch[w];  // one order in every block
  const float scale = rsqrtf(total / static_cast<float>(h) + eps);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    x.u[j] = Scale4(gamma.u[j], x.u[j], scale);
    x.v[j] = Scale4(gamma.v[j], x.v[j], scale);
  }
}

// The normalized row as QuantizeI16 would write it from global memory (int16 super-blocks, their
// scales and f32 sub-block sums).
__device__ __forceinline__ void QuantizeNormRow(const NormRow& x, int nsb, int16_t* xq, float* xsc, float* sxs, int warp,
                                                int lane) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int sb = warp + kNormWarps * j;
    if (sb < nsb) QuantizeSuperBlockI16(x.u[j], x.v[j], sb, xq, xsc, sxs, lane);
  }
}

// The normalized row as h contiguous floats (the router blocks' f32 products read it).
__device__ __forceinline__ void StoreNormRow(const NormRow& x, int nsb, float* xs, int warp, int lane) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int sb = warp + kNormWarps * j;
    if (sb < nsb) {
      float4* p = reinterpret_cast<float4*>(xs + sb * 256 + 8 * lane);
      p[0] = x.u[j];
      p[1] = x.v[j];
    }
  }
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_FUSED_NORM_CUH_
