// The A operand of the warp-specialized weights-as-A wgmma kernel kWgmmaWs (expert_prefill_wgws.cu;
// this header is branch h/wgpipe's, written for kWgmmaPipe): the dequantization of one 64-deep
// stage of a warp's 16 Q4_K weight rows from their raw ring bytes straight into wgmma A fragments.
// The same operations as kWgmma's SubBlockFactors and dequant lambda (expert_prefill_wgexp.cu), so
// both feed the tensor cores the same f16 bits (their outputs are compared bit for bit). kWgmma
// keeps its own copy while it is the A/B baseline (TANDEM_PREFILL_WGMMA=1): calling this from it
// changed its register allocation (gate/up 221 -> 222); fold the two when kWgmma is retired.
// Device code only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGEXP_A_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGEXP_A_CUH_

#include <cuda_fp16.h>

#include <cstdint>

#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_stream.cuh"

namespace tandem::cuda::wgexp_a {

// Bytes of one weight row in a ring stage: the 16-byte super-block head, then 32 quant bytes.
inline constexpr int kRawRowBytes = 48;

// half2(f16(d·sc_j), f16(−dmin·m_j)) of sub-block j of the super-block whose 16-byte head is `head`
// (UnpackKScaleMin of common/weights/block_layouts.h; the streamed kernel's StageFactors for one j,
// h/xlarge's SubBlockFactors).
__device__ __forceinline__ uint32_t SubBlockFactors(const uint4& head, int j) {
  uint32_t sc, m;
  if (j < 4) {
    sc = head.y & 0x3F3F3F3Fu;
    m = head.z & 0x3F3F3F3Fu;
  } else {
    sc = (head.w & 0x0F0F0F0Fu) | ((head.y >> 2) & 0x30303030u);
    m = ((head.w >> 4) & 0x0F0F0F0Fu) | ((head.z >> 2) & 0x30303030u);
  }
  const uint32_t i = static_cast<uint32_t>(j & 3);
  // Bytes: sc_i, sc_i, m_i, m_i; the high byte of each half is replaced by 0x64: 1024 + value.
  const uint32_t pair = __byte_perm(sc, m, i | (i << 4) | ((4 + i) << 8) | ((4 + i) << 12));
  const __half2 scm =
      __hsub2(AsHalf2(prefill_stream::AndOr(pair, 0x00FF00FFu, 0x64006400u)), __float2half2_rn(1024.0f));
  return Half2Bits(__hmul2(AsHalf2(head.x ^ 0x80000000u), scm));
}

// The byte selector of lane (g, q): bytes 2q, 2q + 1 of every 8 (the streamed kernel's).
__device__ __forceinline__ uint32_t LaneSelector(int q) {
  return static_cast<uint32_t>((2 * q) | ((2 * q) << 4) | ((2 * q + 1) << 8) | ((2 * q + 1) << 12));
}

// The A fragments (rows g and g + 8 of the warp's 16) of a stage whose quant chunk is c (= stage
// & 3: sub-blocks 2c, 2c + 1); raw: the raw bytes of the warp's row g in the stage (row g + 8 is
// 8 rows further). k16 slice kk of the stage is the low nibbles of quant bytes 16kk .. (kk 0, 1;
// sub-block 2c) or the high nibbles of bytes 16(kk − 2) .. (kk 2, 3; sub-block 2c + 1).
__device__ __forceinline__ void DequantStage(const uint8_t* raw, int c, uint32_t sel, uint32_t (&dst)[4][4]) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {  // A rows g, g + 8: registers ri, 2 + ri of each slice
    const uint8_t* row = raw + ri * 8 * kRawRowBytes;
    const uint4 head = *reinterpret_cast<const uint4*>(row);
    const uint4 qa = *reinterpret_cast<const uint4*>(row + 16);
    const uint4 qb = *reinterpret_cast<const uint4*>(row + 32);
    const uint32_t flo = SubBlockFactors(head, 2 * c), fhi = SubBlockFactors(head, 2 * c + 1);
    const uint32_t p0 = __byte_perm(qa.x, qa.y, sel), p1 = __byte_perm(qa.z, qa.w, sel);
    const uint32_t p2 = __byte_perm(qb.x, qb.y, sel), p3 = __byte_perm(qb.z, qb.w, sel);
    dst[0][ri] = prefill_stream::DequantNibblePair<false>(p0, flo);
    dst[0][2 + ri] = prefill_stream::DequantNibblePair<false>(p1, flo);
    dst[1][ri] = prefill_stream::DequantNibblePair<false>(p2, flo);
    dst[1][2 + ri] = prefill_stream::DequantNibblePair<false>(p3, flo);
    dst[2][ri] = prefill_stream::DequantNibblePair<true>(p0, fhi);
    dst[2][2 + ri] = prefill_stream::DequantNibblePair<true>(p1, fhi);
    dst[3][ri] = prefill_stream::DequantNibblePair<true>(p2, fhi);
    dst[3][2 + ri] = prefill_stream::DequantNibblePair<true>(p3, fhi);
  }
}

}  // namespace tandem::cuda::wgexp_a

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGEXP_A_CUH_
