// What the two weights-as-A wgmma expert kernels share, kWgmma (expert_prefill_wgexp.cu) and
// kWgmmaWs (expert_prefill_wgws.cu): the dequantization of one 64-deep stage of a warp's 16 Q4_K
// weight rows from their raw ring bytes straight into wgmma A fragments (DequantStage), the
// stage's four wgmmas (StageMma) and the persistent launch (LaunchPersistentWgmma). Sharing them
// makes both kernels feed the tensor cores the same f16 bits in the same order (their outputs are
// compared bit for bit).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGEXP_A_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGEXP_A_CUH_

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_stream.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_wgexp.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/wgmma_f16.cuh"

namespace tandem::cuda::wgexp_a {

// The ring both kernels stream a unit through, one 64-deep k-stage a slot: the stage's slice of
// the unit's token tile (kMaxN rows of 64 f16, 128-byte swizzled: 32 KB), then the raw Q4_K bytes
// of the unit's kUnitRows weight rows (6 KB).
inline constexpr int kUnitRows = kWgmmaUnitRows;  // weight rows of a unit: M of the block
inline constexpr int kMaxN = kWgmmaMaxTileRows;   // token rows of a tile: wgmma N <= 256
inline constexpr int kStageK = 64;
inline constexpr int kQ4KBlockBytes = 144;
// Bytes of one weight row in a ring stage: the 16-byte super-block head, then 32 quant bytes.
inline constexpr int kRawRowBytes = 48;
inline constexpr int kBBytes = kMaxN * 128;                 // activation tile: 32 KB
inline constexpr int kRawBytes = kUnitRows * kRawRowBytes;  // 6 KB
inline constexpr int kStageBytes = kBBytes + kRawBytes;     // multiple of 1024: every swizzle atom aligned
inline constexpr int kStages = 5;
inline constexpr int kRingBytes = kStages * kStageBytes;
static_assert(kStageBytes % 1024 == 0, "aligned swizzle atoms");

// Both kernels' arguments (LaunchWgmmaQ4KGemm / LaunchWgmmaWsQ4KGemm in expert_prefill_wgexp.cuh
// and expert_prefill_wgws.cuh say what they are).
struct KernelArgs {
  const PrefillTile* tiles;
  int num_tiles;
  const uint16_t* a;
  const int32_t* a_index;
  int K, N, out_cols;
  uint16_t* act_out;
  float* f32_out;
  const int* tile_count;
};

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

// The four k16 wgmmas of one 64-deep stage: A from registers (DequantStage's fragments), B the
// stage's swizzled activation tile at shared address sb; acc accumulated into unless `first` (the
// unit's first stage overwrites it). Fenced as both kernels need: the A registers written before
// the wgmmas read them, acc ordered around the asynchronous MMAs. Committed as one group.
template <int kN>
__device__ __forceinline__ void StageMma(float (&acc)[kN / 2], const uint32_t (&src)[4][4], uint32_t sb, bool first) {
  wgmma::FenceOperands(acc);
  wgmma::Fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma::WgmmaRegA<kN>::Run(acc, src[kk], wgmma::SwizzledDesc(sb + 32 * kk), first && kk == 0 ? 0 : 1);
  }
  wgmma::Commit();
  wgmma::FenceOperands(acc);
}

// Launches a persistent wgmma expert kernel under PDL: one block an SM, at most one a unit (tile x
// kWgmmaUnitRows weight rows: num_tiles x N / kWgmmaUnitRows units), `smem` bytes of dynamic shared
// memory (opted in here). Args: the kernel's argument struct, with num_tiles and N.
template <typename Args>
cudaError_t LaunchPersistentWgmma(void (*kernel)(Args), const Args& args, int threads, int smem, cudaStream_t stream) {
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); e != cudaSuccess) {
    return e;
  }
  int device = 0, sms = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess) return e;
  const int64_t units = static_cast<int64_t>(args.num_tiles) * (args.N / kWgmmaUnitRows);
  const int64_t blocks = std::min<int64_t>(units, std::max(sms, 1));
  return LaunchPrefillPdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads), smem, stream, args);
}

}  // namespace tandem::cuda::wgexp_a

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_WGEXP_A_CUH_
