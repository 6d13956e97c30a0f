// Warp-level f16 tensor-core building blocks shared by the tensor-core kernels (prefill attention,
// grouped expert prefill): shared-memory addresses, ldmatrix loads, the m16n8k16 f16 MMA with f32
// accumulation, and packing two floats into an f16 pair. Device code only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MMA_F16_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MMA_F16_CUH_

#include <cuda_fp16.h>

#include <cstdint>

namespace tandem::cuda {

// The shared-memory address of a generic pointer into shared memory (for ldmatrix / cp.async).
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 × 8 b16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The same, each matrix transposed.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a · b for one m16n8k16 tile: f16 operands, f32 accumulators.
__device__ __forceinline__ void MmaF16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// f16(lo) in the low half, f16(hi) in the high half (round to nearest even).
__device__ __forceinline__ uint32_t PackF16x2(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return static_cast<uint32_t>(__half_as_ushort(v.x)) | (static_cast<uint32_t>(__half_as_ushort(v.y)) << 16);
}

// The bits of an f16 pair as __half2, and back (register moves).
__device__ __forceinline__ __half2 AsHalf2(uint32_t bits) {
  __half2 h;
  __builtin_memcpy(&h, &bits, sizeof(h));
  return h;
}
__device__ __forceinline__ uint32_t Half2Bits(__half2 h) {
  uint32_t bits;
  __builtin_memcpy(&bits, &h, sizeof(bits));
  return bits;
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MMA_F16_CUH_
