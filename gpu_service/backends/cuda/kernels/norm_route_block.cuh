// The route blocks of the ffn norm's launch with NormRoute (norm_streams.cuh): the blocks past the
// norm's own block form the routing logits from their parts (kernels/route_compose.cuh), so that
// the fused MoE kernel after the norm starts from ready logits instead of a router product.
// Device-only; include from norm_streams.cu (internal linkage).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROUTE_BLOCK_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROUTE_BLOCK_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/norm_row.cuh"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/kernels/route_compose.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

// Route block b (1 <= b < gridDim.x) of a one-token, one-stream norm whose own block is block 0,
// kVec float4 a thread over kThreads threads as InjectRmsNormRegKernel<kVec, kThreads>: warp w
// takes router row r = (b − 1)·warps + w. Before the PDL wait, from data whose writers are two or
// more launches back (pdl.cuh: H's row, the earlier inject's y and shared term, the weights): the
// row's loads first (all of a lane's at once: one memory round trip, the window before the wait
// is ~2.5 us after attention's output product), then H' = H + earlier inject, u = γ ⊙ H' (shared
// memory) and a_r = w_r · u. After the wait: H' + y and its sum of squares with the norm block's
// operations in its order, so `scale` is that block's 1/ρ to the bit, and
//   logits[r] = scale · (a_r + inv_scale[r] · (parts[r] + kRouteLoScale · parts[padded + r])).
// The launch gives each row its warp (rows ≤ warps of the route blocks).
template <int kVec, int kThreads>
__device__ __forceinline__ void NormRouteBlock(const float* H, int64_t h, const float* y, const float* gamma,
                                               float eps, const EarlierInject& earlier, const NormRoute& route,
                                               float* scratch, float4* u) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kRowQuads = kVec * kThreads / 32;  // a lane's float4 of a row (h4 <= kVec·kThreads)
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int64_t h4 = h / 4;
  const int r = (static_cast<int>(blockIdx.x) - 1) * kWarps + warp;
  float4 w[kRowQuads];
  if (r < route.rows) {
    const float4* w4 = reinterpret_cast<const float4*>(route.w + static_cast<int64_t>(r) * h);
#pragma unroll
    for (int k = 0; k < kRowQuads; ++k) {
      const int64_t i = lane + 32 * k;
      w[k] = i < h4 ? __ldg(w4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
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
  float a = 0.0f;
  if (r < route.rows) {
#pragma unroll
    for (int k = 0; k < kRowQuads; ++k) {
      const int64_t i = lane + 32 * k;
      if (i < h4) {
        const float4 x = u[i];
        a = fmaf(w[k].x, x.x, fmaf(w[k].y, x.y, fmaf(w[k].z, x.z, fmaf(w[k].w, x.w, a))));
      }
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

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROUTE_BLOCK_CUH_
