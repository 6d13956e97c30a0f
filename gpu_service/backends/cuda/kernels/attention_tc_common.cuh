// Device pieces shared by the tensor-core prefill attention kernels (attention_tc.cu: the mma.sync
// kernel and the slice merge; attention_tc_wgmma.cu: the wgmma kernel): the cp.async copy with
// zero fill and the key-tile slices of an item, which the kernels and the merge must compute alike.
// Device code only; internal to the kernels folder.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_COMMON_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_COMMON_CUH_

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

}  // namespace tandem::cuda::attn_tc

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_COMMON_CUH_
