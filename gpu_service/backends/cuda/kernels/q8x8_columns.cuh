// The column-split product's block pieces, shared by the kernels that add one Q8_0x8 super-block
// of columns (256) of a matrix's rows times 256 activations into y (dense_colsplit.cu's
// ColumnSplitKernel, gdn_decode_fused_kernel.cuh's output product inside the fused GDN kernel): the
// activations quantized to int16 with one scale per Q8_0 block of 32 (a warp's), and one row's
// super-block (in shared memory: eight f16 scales, then 8 × 32 int8 quants; device_matrix.h)
// summed with dp2a (int8 × int16, exact in int32 within a block) and one f32 scale product a block.
// Device-only; internal linkage.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_Q8X8_COLUMNS_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_Q8X8_COLUMNS_CUH_

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {
namespace {

constexpr int kColumnSuperCols = 256;
constexpr int kColumnSuperBytes = static_cast<int>(kQ8_0x8SuperBytes);

// Shared memory of a block holding `rows` rows' super-blocks, then the 256 activations as int16 and
// their 8 scales (QuantizeColumnI16).
inline size_t ColumnSharedBytes(int rows) {
  return static_cast<size_t>(rows) * kColumnSuperBytes + kColumnSuperCols * sizeof(int16_t) + 8 * sizeof(float);
}

// Copies `rows` rows' super-blocks (src: the first row's, rows row_bytes apart; 16-byte aligned) into
// shared memory at dst (shared address), back to back, with the block's kThreads threads' 16-byte
// cp.async pieces, and commits them as one group (CpAsyncWait<0> waits for them).
template <int kThreads>
__device__ __forceinline__ void CopyColumnRows(uint32_t dst, const uint8_t* src, int64_t row_bytes, int rows, int tid) {
  constexpr int kPieces = kColumnSuperBytes / 16;
  for (int i = tid; i < rows * kPieces; i += kThreads) {
    const int row = i / kPieces, piece = i - row * kPieces;
    CpAsync16(dst + row * kColumnSuperBytes + piece * 16, src + row * row_bytes + piece * 16);
  }
  CpAsyncCommit();
}

// The block's 256 activations (thread t holds column t: 256 threads, warp w the Q8_0 block w) as
// int16 into xq[t], with the warp's scale max|x| / 32767 into xscale[w].
__device__ __forceinline__ void QuantizeColumnI16(float xv, int tid, int lane, int warp, int16_t* xq, float* xscale) {
  float m = fabsf(xv);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  const float inv = m > 0.0f ? 32767.0f / m : 0.0f;
  xq[tid] = static_cast<int16_t>(__float2int_rn(xv * inv));
  if (lane == 0) xscale[warp] = m * (1.0f / 32767.0f);
}

// s + Σ of 16 int8 quants (qv) times their int16 activations (x0: the first eight, x1: the next):
// eight dp2a, each two int8 × int16 pairs, exact in int32 within a Q8_0 block.
__device__ __forceinline__ int Dp2aSixteen(int s, uint4 qv, uint4 x0, uint4 x1) {
  s = __dp2a_lo(static_cast<int>(x0.x), static_cast<int>(qv.x), s);
  s = __dp2a_hi(static_cast<int>(x0.y), static_cast<int>(qv.x), s);
  s = __dp2a_lo(static_cast<int>(x0.z), static_cast<int>(qv.y), s);
  s = __dp2a_hi(static_cast<int>(x0.w), static_cast<int>(qv.y), s);
  s = __dp2a_lo(static_cast<int>(x1.x), static_cast<int>(qv.z), s);
  s = __dp2a_hi(static_cast<int>(x1.y), static_cast<int>(qv.z), s);
  s = __dp2a_lo(static_cast<int>(x1.z), static_cast<int>(qv.w), s);
  s = __dp2a_hi(static_cast<int>(x1.w), static_cast<int>(qv.w), s);
  return s;
}

// Σ over one row's super-block (sb, in shared memory) of weight × activation: eight dp2a chains of
// 32 (int8 quants × the int16 activations in xq), each times its f16 weight scale and xscale.
__device__ __forceinline__ float ColumnSuperRowDot(const uint8_t* sb, const int16_t* xq, const float* xscale) {
  const uint4* xw = reinterpret_cast<const uint4*>(xq);
  const uint4 d4 = *reinterpret_cast<const uint4*>(sb);
  const uint32_t dw[4] = {d4.x, d4.y, d4.z, d4.w};
  float acc = 0.0f;
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    const uint4* q = reinterpret_cast<const uint4*>(sb + 16 + 32 * b);
    int s = 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // Columns 16·half .. + 15 and their int16 activations.
      s = Dp2aSixteen(s, q[half], xw[4 * b + 2 * half], xw[4 * b + 2 * half + 1]);
    }
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(dw[b / 2] >> (16 * (b & 1)))));
    acc = fmaf(static_cast<float>(s), d * xscale[b], acc);
  }
  return acc;
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_Q8X8_COLUMNS_CUH_
