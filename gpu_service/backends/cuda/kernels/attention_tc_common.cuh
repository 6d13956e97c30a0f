// Device pieces shared by the tensor-core prefill attention kernels (attention_tc.cu: the mma.sync
// kernel and the slice merge; attention_tc_wgmma.cu: the wgmma kernel): the cp.async copy with
// zero fill, the key-tile slices of an item, which the kernels and the merge must compute alike,
// and the online-softmax step on a score tile, which keeps the two kernels' outputs bit for bit
// equal. Device code only; internal to the kernels folder.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_COMMON_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_COMMON_CUH_

#include <cmath>
#include <cstdint>

#include "gpu_service/backends/cuda/kernels/attention_tc.cuh"

namespace tandem::cuda::attn_tc {

// Keys per K/V tile: one cache page.
inline constexpr int kTileKeys = kKvPageSize;

// 16 bytes global -> shared, bypassing L1; zeros instead when !valid (nothing is read).
__device__ __forceinline__ void CpAsync16OrZero(uint32_t dst, const float* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// The key tiles of an item ending at max_pos cut into at most `splits` slices of `per` tiles;
// `used` of them are non-empty. The kernels and the merge compute it alike from the positions.
struct TcSlices {
  int tiles, per, used;
};
__device__ __forceinline__ TcSlices SlicesOf(int32_t max_pos, int splits) {
  const int tiles = max_pos / kTileKeys + 1;
  const int per = (tiles + splits - 1) / splits;
  return TcSlices{tiles, per, (tiles + per - 1) / per};
}

// One key tile's online-softmax step in base 2 for the thread's two query rows (g and g + 8 of
// its warp's 16), on the scores it holds in the m16n8 accumulator layout: n8 block nb (keys
// key0 + 8nb ..) in s[4nb + c], c < 2 on row g and c >= 2 on row g + 8, columns 2·t4 + (c & 1).
// Scales the scores by scale_log2 and, where `mask`, sets keys past the row's position (pos_lo,
// pos_hi) to −inf; takes the rows' new maxima over the quad (m), replaces each score by
// p = 2^(s − m) and adds the tile's sums to l; corr is the factor the rows' output accumulators
// must be scaled by (1 while a row has seen no key).
template <int kKeys>
__device__ __forceinline__ void OnlineSoftmaxTile(float (&s)[kKeys / 2], float (&m)[2], float (&l)[2],
                                                  float (&corr)[2], float scale_log2, bool mask, int key0, int t4,
                                                  int pos_lo, int pos_hi) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int nb = 0; nb < kKeys / 8; ++nb) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float v = s[4 * nb + c] * scale_log2;
      if (mask && key0 + nb * 8 + 2 * t4 + (c & 1) > (c < 2 ? pos_lo : pos_hi)) v = -INFINITY;
      s[4 * nb + c] = v;
      mx[c >> 1] = fmaxf(mx[c >> 1], v);
    }
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 2));
    corr[i] = mx[i] == -INFINITY ? 1.0f : exp2f(m[i] - mx[i]);
    m[i] = mx[i];
  }
#pragma unroll
  for (int nb = 0; nb < kKeys / 8; ++nb) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float mm = m[c >> 1];
      const float p = mm == -INFINITY ? 0.0f : exp2f(s[4 * nb + c] - mm);
      s[4 * nb + c] = p;
      sum[c >> 1] += p;
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) l[i] = l[i] * corr[i] + sum[i];
}

}  // namespace tandem::cuda::attn_tc

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_COMMON_CUH_
