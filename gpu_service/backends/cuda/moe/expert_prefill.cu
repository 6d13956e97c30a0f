#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"

#include <cuda_bf16.h>

#include <algorithm>

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint16_t ToBf16Bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// One thread per 32-element piece.
template <uint32_t kType>
__global__ void __launch_bounds__(kThreads) DequantBf16Kernel(const uint8_t* w, int cols, int rows, uint16_t* out) {
  const int pieces = cols / 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= static_cast<int64_t>(pieces) * rows) return;
  const int64_t r = i / pieces;
  const int p = static_cast<int>(i % pieces);
  const int64_t row_bytes = static_cast<int64_t>(cols) / BlockGeometry<kType>::kElems * BlockGeometry<kType>::kBytes;
  float v[32];
  DequantChunk<kType>(w + r * row_bytes, p, v);
  uint32_t packed[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) packed[k] = ToBf16Bits(v[2 * k]) | (static_cast<uint32_t>(ToBf16Bits(v[2 * k + 1])) << 16);
  uint4* dst = reinterpret_cast<uint4*>(out + r * cols + p * 32);
#pragma unroll
  for (int k = 0; k < 4; ++k) dst[k] = make_uint4(packed[4 * k], packed[4 * k + 1], packed[4 * k + 2], packed[4 * k + 3]);
}

template <uint32_t kType>
cudaError_t LaunchDequant(const void* w, int cols, int rows, uint16_t* out, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(cols / 32) * rows;
  const unsigned blocks = static_cast<unsigned>((total + kThreads - 1) / kThreads);
  DequantBf16Kernel<kType><<<blocks, kThreads, 0, stream>>>(static_cast<const uint8_t*>(w), cols, rows, out);
  return cudaGetLastError();
}

__global__ void GatherBf16Kernel(const float* x, int cols, const int32_t* index, uint16_t* out) {
  const int i = blockIdx.y;
  const float* src = x + static_cast<int64_t>(index[i]) * cols;
  for (int c = blockIdx.x * kThreads + threadIdx.x; c < cols; c += gridDim.x * kThreads) {
    out[static_cast<int64_t>(i) * cols + c] = ToBf16Bits(src[c]);
  }
}

__global__ void SiluMulKernel(const float* gu, int m, int inner, uint16_t* act) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= static_cast<int64_t>(m) * inner) return;
  const int64_t t = i / inner, j = i % inner;
  const float g = gu[t * 2 * inner + j];
  const float u = gu[t * 2 * inner + inner + j];
  act[i] = ToBf16Bits(g * (1.0f / (1.0f + expf(-g))) * u);
}

}  // namespace

cudaError_t LaunchDequantizeToBf16(uint32_t type, const void* w, int cols, int rows, uint16_t* out,
                                   cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int align = KernelRowAlignment(type);
  if (align == 0 || cols <= 0 || cols % RowLengthMultiple(type) != 0 || reinterpret_cast<uintptr_t>(w) % align != 0) {
    return cudaErrorInvalidValue;
  }
  switch (type) {
    case kTypeF32: return LaunchDequant<kTypeF32>(w, cols, rows, out, stream);
    case kTypeF16: return LaunchDequant<kTypeF16>(w, cols, rows, out, stream);
    case kTypeBF16: return LaunchDequant<kTypeBF16>(w, cols, rows, out, stream);
    case kTypeQ4_0: return LaunchDequant<kTypeQ4_0>(w, cols, rows, out, stream);
    case kTypeQ8_0: return LaunchDequant<kTypeQ8_0>(w, cols, rows, out, stream);
    case kTypeQ2_K: return LaunchDequant<kTypeQ2_K>(w, cols, rows, out, stream);
    case kTypeQ3_K: return LaunchDequant<kTypeQ3_K>(w, cols, rows, out, stream);
    case kTypeQ4_K: return LaunchDequant<kTypeQ4_K>(w, cols, rows, out, stream);
    case kTypeQ5_K: return LaunchDequant<kTypeQ5_K>(w, cols, rows, out, stream);
    case kTypeQ6_K: return LaunchDequant<kTypeQ6_K>(w, cols, rows, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchGatherRowsBf16(const float* x, int cols, const int32_t* index, int m, uint16_t* out,
                                 cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  const unsigned gx = static_cast<unsigned>(std::min((cols + kThreads - 1) / kThreads, 16));
  GatherBf16Kernel<<<dim3(gx, m), kThreads, 0, stream>>>(x, cols, index, out);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMulToBf16(const float* gu, int m, int inner, uint16_t* act, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(m) * inner;
  if (total <= 0) return cudaSuccess;
  SiluMulKernel<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(gu, m, inner, act);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
