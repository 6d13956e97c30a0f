// The route blocks of the ffn norm's launch with NormRoute (norm_streams.cuh): the blocks past the
// norm's own block form the routing logits from their parts (kernels/route_compose.cuh), so that
// the fused MoE kernel after the norm starts from ready logits instead of a router product.
// Device-only; include from norm_streams.cu (internal linkage).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROUTE_BLOCK_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROUTE_BLOCK_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/dot_quad.cuh"
#include "gpu_service/backends/cuda/kernels/norm_row.cuh"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/kernels/route_compose.cuh"
#include "gpu_service/backends/cuda/load_acquire.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/spin_wait.cuh"

namespace tandem::cuda {
namespace {

// A route block's warp takes one router row (the launch sizes the grid for it), so that a layer's
// 513 rows (80B shapes) are 65 blocks' loads in flight at once before the wait.
// float4 loads a lane issues together for a row (a row of h 2048 in two groups).
constexpr int kNormRouteLoads = 8;

// Route block b (1 <= b < gridDim.x) of a one-token, one-stream norm whose own block is block 0,
// kVec float4 a thread over kThreads threads as InjectRmsNormRegKernel<kVec, kThreads>. Before the
// PDL wait, from data whose writers are two or more launches back (pdl.cuh: H's row, the earlier
// inject's y and shared term, the weights): H' = H + earlier inject, u = γ ⊙ H' (shared memory),
// and its warp's router row's dot a_r = w_r · u. After the wait: H' + y and its sum of squares
// with the norm block's operations in its order, so `scale` is that block's 1/ρ to the bit, and
//   logits[r] = scale · (a_r + inv_scale[r] · (parts[r] + kRouteLoScale · parts[padded + r])).
// H is rewritten by the norm's block after its wait, which may come before a route block even
// starts (a launch without a kernel before it, or route blocks scheduled late): each route block
// counts itself in route.h_reads once its H values are in registers, and the norm's block waits
// for that count before it writes (NormRouteWaitForReads). Without it the first device run of the
// kernel test read H + y as H' (relative L2 0.2 at h 2048).
template <int kVec, int kThreads>
__device__ __forceinline__ void NormRouteBlock(const float* H, int64_t h, const float* y, const float* gamma,
                                               float eps, const EarlierInject& earlier, const NormRoute& route,
                                               float* scratch, float4* u) {
  constexpr int kWarps = kThreads / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int64_t h4 = h / 4;
  const float4* g = reinterpret_cast<const float4*>(gamma);
  const float4* hr = reinterpret_cast<const float4*>(H);
  const float4* er = earlier.y ? reinterpret_cast<const float4*>(earlier.y) : nullptr;
  const float4* esr = er && earlier.sh.shared ? reinterpret_cast<const float4*>(earlier.sh.shared) : nullptr;
  const float egs = esr ? norm_row::SharedGate(earlier.sh.gate_logit, 0) : 1.0f;
  float4 v[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t i = threadIdx.x + k * kThreads;
    v[k] = i < h4 ? hr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (er && i < h4) {
      float4 e = er[i];
      if (esr) e = norm_row::AddShared(e, egs, esr[i]);
      v[k] = norm_row::InjectQuad(v[k], 1.0f, e);
    }
    if (i < h4) {
      const float4 gg = g[i];
      u[i] = make_float4(gg.x * v[k].x, gg.y * v[k].y, gg.z * v[k].z, gg.w * v[k].w);
    }
  }
  __syncthreads();
  // Every thread's H values are in registers (u is formed from them): the norm's block may now
  // rewrite H (NormRouteWaitForReads).
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(route.h_reads, 1);
  }
  const int r = (static_cast<int>(blockIdx.x) - 1) * kWarps + warp;
  float a = 0.0f;
  if (r < route.rows) {
    const float4* w4 = reinterpret_cast<const float4*>(route.w + static_cast<int64_t>(r) * h);
    for (int64_t base = lane; base < h4; base += 32 * kNormRouteLoads) {
      float4 w[kNormRouteLoads];
#pragma unroll
      for (int k = 0; k < kNormRouteLoads; ++k) {
        const int64_t i = base + 32 * k;
        w[k] = i < h4 ? __ldg(w4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      a = DotLanes(w, u, base, h4, a);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xFFFFFFFFu, a, off);
  PdlWaitForPrevious();  // y and the parts: the launch just before wrote them
  PdlAllowNext();
  const float4* yr = reinterpret_cast<const float4*>(y);
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t i = threadIdx.x + k * kThreads;
    if (i >= h4) break;
    v[k] = norm_row::InjectQuad(v[k], 1.0f, yr[i]);
    ss = norm_row::AddSquares(ss, v[k]);
  }
  ss = BlockSum(ss, scratch);
  const float scale = norm_row::RmsScale(ss, h, eps);
  if (lane == 0 && r < route.rows) {
    const float part = fmaf(kRouteLoScale, route.parts[route.padded + r], route.parts[r]);
    route.logits[r] = scale * fmaf(route.inv_scale[r], part, a);
  }
}

// The norm's own block (block 0), before it rewrites H: waits until the launch's route blocks have
// all read H (their count in route.h_reads), then takes their count back out for the next launch.
// Route blocks that never counted would be a bug: the wait traps (spin_wait.cuh).
__device__ __forceinline__ void NormRouteWaitForReads(const NormRoute& route) {
  if (threadIdx.x == 0) {
    const int blocks = static_cast<int>(gridDim.x) - 1;
    SpinUntil<64>([&] { return LoadAcquire(route.h_reads) >= blocks; });
    atomicSub(route.h_reads, blocks);
  }
  __syncthreads();
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROUTE_BLOCK_CUH_
