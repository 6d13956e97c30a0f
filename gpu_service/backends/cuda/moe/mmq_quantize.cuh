// The MMQ activation quantization of one 256-element group by one warp (expert_prefill_mmq.cuh:
// s = max|x| / 127, hi = round(x / s), lo = round((x / s − hi) · 64), the float sum of every 32),
// as a device function: LaunchMmqQuantize's kernel and the stream norm that writes the MoE input
// already quantized (norm_streams.cuh, LaunchInjectRmsNormF16's MmqQuantOut) both run this one
// body, so their planes are bit for bit the same. Raw plane pointers, so that the dense kernels'
// library needs no MoE type. Device code only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MMQ_QUANTIZE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MMQ_QUANTIZE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda::mmq_quantize {

// Lane `lane` holds elements 8·lane .. 8·lane + 7 of group sb (of K / 256) of row `row` in v.
// Writes hi/lo (int8 [rows][K]), sumx (f32 [rows][K / 32]) and scale (f32 [rows][K / 256]).
// Every lane of the warp must call it (shuffles over the full warp).
__device__ __forceinline__ void QuantizeGroup(const float (&v)[8], int lane, int64_t row, int sb, int K, int8_t* q_hi,
                                              int8_t* q_lo, float* q_scale, float* q_sumx) {
  const int KB = K / 256;
  const int64_t base = row * K + sb * 256 + lane * 8;
  float amax = 0.0f, sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    amax = fmaxf(amax, fabsf(v[i]));
    sum += v[i];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
  sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  uint32_t hw[2] = {0, 0}, lw[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float y = v[i] * inv;
    const float hi = fminf(fmaxf(rintf(y), -127.0f), 127.0f);
    const float lo = fminf(fmaxf(rintf((y - hi) * 64.0f), -127.0f), 127.0f);
    hw[i >> 2] |= (static_cast<uint32_t>(static_cast<int>(hi)) & 0xFFu) << (8 * (i & 3));
    lw[i >> 2] |= (static_cast<uint32_t>(static_cast<int>(lo)) & 0xFFu) << (8 * (i & 3));
  }
  *reinterpret_cast<uint2*>(q_hi + base) = make_uint2(hw[0], hw[1]);
  *reinterpret_cast<uint2*>(q_lo + base) = make_uint2(lw[0], lw[1]);
  if ((lane & 3) == 0) q_sumx[row * (K / 32) + sb * 8 + lane / 4] = sum;
  if (lane == 0) q_scale[row * KB + sb] = amax / 127.0f;
}

}  // namespace tandem::cuda::mmq_quantize

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MMQ_QUANTIZE_CUH_
