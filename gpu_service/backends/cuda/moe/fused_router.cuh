// The router blocks of the fused one-token MoE kernel (FusedRouter, expert_decode_fused.cuh): the
// router product's rows computed by the grid's first blocks, and the expert blocks' wait for their
// count. Device code only (included by expert_decode_fused_kernel.cuh); internal linkage, as in
// matvec_core.cuh.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_FUSED_ROUTER_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_FUSED_ROUTER_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/kernels/dot_quad.cuh"
#include "gpu_service/backends/cuda/load_acquire.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/spin_wait.cuh"

namespace tandem::cuda {
namespace {

constexpr int kFusedRouterWarps = 4;  // a block's warps (the fused kernel's)

// A router row's float4s of one lane (lane + 32j, j < kRouterQuads: h <= 2048, FusedShapeOk).
constexpr int kRouterQuads = 2048 / 4 / 32;
// Why inline PTX where the row is whole (h = 2048): in the fused MoE kernel (96 registers) nvcc
// issued the predicated loop's 16 loads of a row read after the wait six at a time, each group
// into the registers of the one before once its products were done, so a warp's second row waited
// three L2 round trips (the router blocks' last exit ~1.3 us after their median, probe). One asm
// statement issues all 16.
__device__ __forceinline__ void LoadRouterRow(const float4* w4, int h4, int lane, float4 (&w)[kRouterQuads]) {
  if (h4 == 32 * kRouterQuads) {
    asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%64+0];\n\t"
                 "ld.global.nc.v4.f32 {%4, %5, %6, %7}, [%64+512];\n\t"
                 "ld.global.nc.v4.f32 {%8, %9, %10, %11}, [%64+1024];\n\t"
                 "ld.global.nc.v4.f32 {%12, %13, %14, %15}, [%64+1536];\n\t"
                 "ld.global.nc.v4.f32 {%16, %17, %18, %19}, [%64+2048];\n\t"
                 "ld.global.nc.v4.f32 {%20, %21, %22, %23}, [%64+2560];\n\t"
                 "ld.global.nc.v4.f32 {%24, %25, %26, %27}, [%64+3072];\n\t"
                 "ld.global.nc.v4.f32 {%28, %29, %30, %31}, [%64+3584];\n\t"
                 "ld.global.nc.v4.f32 {%32, %33, %34, %35}, [%64+4096];\n\t"
                 "ld.global.nc.v4.f32 {%36, %37, %38, %39}, [%64+4608];\n\t"
                 "ld.global.nc.v4.f32 {%40, %41, %42, %43}, [%64+5120];\n\t"
                 "ld.global.nc.v4.f32 {%44, %45, %46, %47}, [%64+5632];\n\t"
                 "ld.global.nc.v4.f32 {%48, %49, %50, %51}, [%64+6144];\n\t"
                 "ld.global.nc.v4.f32 {%52, %53, %54, %55}, [%64+6656];\n\t"
                 "ld.global.nc.v4.f32 {%56, %57, %58, %59}, [%64+7168];\n\t"
                 "ld.global.nc.v4.f32 {%60, %61, %62, %63}, [%64+7680];\n\t"
                 : "=f"(w[0].x), "=f"(w[0].y), "=f"(w[0].z), "=f"(w[0].w),
                   "=f"(w[1].x), "=f"(w[1].y), "=f"(w[1].z), "=f"(w[1].w),
                   "=f"(w[2].x), "=f"(w[2].y), "=f"(w[2].z), "=f"(w[2].w),
                   "=f"(w[3].x), "=f"(w[3].y), "=f"(w[3].z), "=f"(w[3].w),
                   "=f"(w[4].x), "=f"(w[4].y), "=f"(w[4].z), "=f"(w[4].w),
                   "=f"(w[5].x), "=f"(w[5].y), "=f"(w[5].z), "=f"(w[5].w),
                   "=f"(w[6].x), "=f"(w[6].y), "=f"(w[6].z), "=f"(w[6].w),
                   "=f"(w[7].x), "=f"(w[7].y), "=f"(w[7].z), "=f"(w[7].w),
                   "=f"(w[8].x), "=f"(w[8].y), "=f"(w[8].z), "=f"(w[8].w),
                   "=f"(w[9].x), "=f"(w[9].y), "=f"(w[9].z), "=f"(w[9].w),
                   "=f"(w[10].x), "=f"(w[10].y), "=f"(w[10].z), "=f"(w[10].w),
                   "=f"(w[11].x), "=f"(w[11].y), "=f"(w[11].z), "=f"(w[11].w),
                   "=f"(w[12].x), "=f"(w[12].y), "=f"(w[12].z), "=f"(w[12].w),
                   "=f"(w[13].x), "=f"(w[13].y), "=f"(w[13].z), "=f"(w[13].w),
                   "=f"(w[14].x), "=f"(w[14].y), "=f"(w[14].z), "=f"(w[14].w),
                   "=f"(w[15].x), "=f"(w[15].y), "=f"(w[15].z), "=f"(w[15].w)
                 : "l"(w4 + lane)
                 : "memory");
    return;
  }
#pragma unroll
  for (int j = 0; j < kRouterQuads; ++j) {
    const int i = lane + 32 * j;
    w[j] = i < h4 ? __ldg(w4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}
// The lane's part of w · x, in the first form's order (i = lane, lane + 32, ...).
__device__ __forceinline__ float RouterRowDot(const float4 (&w)[kRouterQuads], const float4* x4, int h4, int lane) {
  return DotLanes(w, x4, lane, h4, 0.0f);
}

// The router blocks of FusedRouter: warp w of block b takes rows 4b + w, 4b + w + 4·rt.blocks, ...;
// lane l the columns 4l + 128i (float4s, coalesced), then a warp sum. The block's rows are
// prefetched into L2 before the PDL wait (constant weights); x is read after it. rt.preload: the
// warp's first row is in registers before the wait, x is staged in shared memory after it, and
// every row's loads are issued together.
__device__ void RouterBlock(const OneTokenMoeArgs& a, const FusedRouter& rt) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int first = static_cast<int>(blockIdx.x) * kFusedRouterWarps + warp, step = rt.blocks * kFusedRouterWarps;
  const int h4 = a.h / 4;
  auto row = [&](int r) { return reinterpret_cast<const float4*>(rt.w + static_cast<int64_t>(r) * a.h); };
  auto finish = [&](int r, float s) {
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, off);
    if (lane == 0) rt.logits[r] = s;
  };
  if (rt.preload) {
    for (int r = first + step; r < rt.rows; r += step) {
      if (lane == 0) PrefetchL2(rt.w + static_cast<int64_t>(r) * a.h, static_cast<unsigned>(a.h) * 4u);
    }
    float4 w[kRouterQuads];
    if (first < rt.rows) LoadRouterRow(row(first), h4, lane, w);
    PdlWaitForPrevious();  // x
    PdlAllowNext();
    float4* xs = reinterpret_cast<float4*>(smem);
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
    for (int i = threadIdx.x; i < h4; i += kFusedRouterWarps * 32) xs[i] = __ldcg(x4 + i);
    __syncthreads();
    if (first < rt.rows) finish(first, RouterRowDot(w, xs, h4, lane));
    for (int r = first + step; r < rt.rows; r += step) {
      LoadRouterRow(row(r), h4, lane, w);
      finish(r, RouterRowDot(w, xs, h4, lane));
    }
  } else {
    for (int r = first; r < rt.rows; r += step) {
      if (lane == 0) PrefetchL2(rt.w + static_cast<int64_t>(r) * a.h, static_cast<unsigned>(a.h) * 4u);
    }
    PdlWaitForPrevious();  // x
    PdlAllowNext();
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
    for (int r = first; r < rt.rows; r += step) {
      const float4* w4 = row(r);
      float s = 0.0f;
      for (int i = lane; i < h4; i += 32) {
        const float4 w = __ldg(w4 + i), v = x4[i];
        s = DotQuad(w, v, s);
      }
      finish(r, s);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // release: the logits before the count
    atomicAdd(rt.counters, 1);
  }
}

// An expert block's wait for the router blocks (one warp; then the warp barrier): the logits are
// visible after the acquire that sees the count complete (router blocks that never counted would
// be a bug: the wait traps, spin_wait.cuh). ConsumeRouter (one thread, after the
// block's wait and its reads of the logits): the last of the `expert_blocks` zeroes both counters
// for the next launch.
__device__ __forceinline__ void WaitRouterBlocks(const FusedRouter& rt) {
  if ((threadIdx.x & 31) == 0) SpinUntil<32>([&] { return LoadAcquire(rt.counters) >= rt.blocks; });
  __syncwarp();
}
__device__ __forceinline__ void ConsumeRouter(const FusedRouter& rt, int expert_blocks) {
  if (atomicAdd(rt.counters + 1, 1) == expert_blocks - 1) {
    rt.counters[0] = 0;
    rt.counters[1] = 0;
  }
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_FUSED_ROUTER_CUH_
