// dp2a, the integer two-way dot product the quantized decode kernels sum with (the one-token MoE
// kernels through q4k_dot.cuh, the LM head's int16 form in matvec_q6k_head.cuh). Device code only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_DP2A_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_DP2A_CUH_

#include <cstdint>

namespace tandem::cuda {

// dp2a without `volatile` (the CUDA header's intrinsics are volatile asm, which the compiler may
// not reorder against other volatile asm): a 16-bit pair of `a` times bytes 0-1 (lo) or 2-3 (hi)
// of `b`, plus c, signed.
__device__ __forceinline__ int Dp2aLo(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp2a.lo.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ int Dp2aHi(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp2a.hi.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_DP2A_CUH_
