// Which warp of a fused one-token MoE block routes (OneTokenMoeArgs::pick_warp_by_slot), from the
// warps' slots on the SM: one rule for the kernel (expert_decode_fused_kernel.cuh) and the pick bench
// (tests/gpu_moe/pick_bench.cu), which measures it. Device code only; internal linkage, as in
// matvec_core.cuh.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_WARP_SLOT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_WARP_SLOT_CUH_

#include <cuda_runtime.h>

namespace tandem::cuda {
namespace {

// The calling warp's slot on its SM (%warpid: PTX calls it volatile; read for placement only).
__device__ __forceinline__ unsigned WarpSlot() {
  unsigned slot;
  asm volatile("mov.u32 %0, %%warpid;" : "=r"(slot));
  return slot;
}

// The routing warp of a block of `warps` warps whose warp 0 sits at slot s: warp (s / 4) mod warps
// (any answer in [0, warps) is correct: the choice only places the work; host too, for the bench's
// check). What is known of it (docs/PERF.md, twenty-ninth session): a block's four warps hold four adjacent slots 4j .. 4j + 3,
// warp w at 4j + (w + j + 1) mod 4 (gpu_moe_bench --pick prints them), so s / 4 = j is the block's
// place on the SM. Routing with warp j mod 4 measured +0.7 .. 1.1% batch-1 decode against warp 0
// in three A/Bs, and +1.6% against warp 0 chosen through the same code. Why is not known: the
// reason first given, an SM's routing warps on distinct sub-partitions, does not hold (with warp 0
// their slots already differ mod 4, and this choice makes two of three share a residue). On
// today's kernel (the act exchange by pushes, gathered by the routing warp) warp 0 measured +1.5%,
// +0.7% and +1.2% against this choice on an H100 (fiftieth and fifty-first sessions), so warp 0 is
// the default again (TANDEM_FUSED_PICK_BY_SLOT=1 for this rule); not yet measured on the H200.
__host__ __device__ __forceinline__ int PickWarpOfSlot(unsigned warp0_slot, int warps) {
  return static_cast<int>((warp0_slot >> 2) % static_cast<unsigned>(warps));
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_WARP_SLOT_CUH_
