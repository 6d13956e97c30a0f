// One token's gated delta-rule update of a block's state columns (device-only header shared by the
// recurrence kernel, gdn.cu, and the fused decode kernel, gdn_decode_fused_kernel.cuh, so that both run the
// same operations in the same order: the fused kernel's state and output are bit for bit the
// recurrence kernel's).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DELTA_RULE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DELTA_RULE_CUH_

#include <cuda_runtime.h>

namespace tandem::cuda {

// The block's kWarps warps hold state column `lane` of kWarps·kRows key rows, warp w rows
// kRows·w .. (s: its kRows entries; qs, ks: the token's q and k entries of those rows). With
// S ← decay·S, kv = kᵀS (summed over the warps through kv_part), delta = b·(v − kv),
// S ← S + k·delta, returns this warp's part of qᵀS for the column (the caller sums the warps'
// parts). Contains one __syncthreads: every thread of the block calls it.
template <int kRows, int kWarps>
__device__ __forceinline__ float DeltaRuleColumnStep(float (&s)[kRows], const float* qs, const float* ks, float decay,
                                                     float b, float v, float (&kv_part)[kWarps][32], int warp,
                                                     int lane) {
  float kv = 0.0f;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    s[i] *= decay;
    kv = fmaf(ks[i], s[i], kv);
  }
  kv_part[warp][lane] = kv;
  __syncthreads();
  kv = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) kv += kv_part[w][lane];
  const float delta = b * (v - kv);
  float out = 0.0f;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    s[i] = fmaf(ks[i], delta, s[i]);
    out = fmaf(qs[i], s[i], out);
  }
  return out;
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DELTA_RULE_CUH_
