#include "gpu_service/backends/cuda/kernels/gemm.cuh"

#include <cuda_fp16.h>

#include "gpu_service/backends/cuda/dequant.cuh"

namespace tandem::cuda {
namespace {

// Eight values as f16 (round to nearest even) into 16 bytes.
__device__ __forceinline__ uint4 PackF16x8(const float* v) {
  uint32_t p[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const __half2 b = __floats2half2_rn(v[2 * e], v[2 * e + 1]);
    p[e] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(p[0], p[1], p[2], p[3]);
}

// v ← v − f16(v) for eight values: what the f16 rounding left out (the low half of a split).
__device__ __forceinline__ void Residual8(float* v) {
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] -= __half2float(__float2half_rn(v[e]));
}

// One thread per 32-element chunk of the row range; writes 64 (f16) or 128 (f32) bytes with
// 16-byte stores; with dst_lo, also the f16 residuals (hi + lo carries ~22 bits of the value).
template <uint32_t kType>
__global__ void DequantizeRowsKernel(const uint8_t* w, int64_t row_bytes, int64_t chunks,
                                     int64_t total, bool to_f16, void* dst, void* dst_lo) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t r = i / chunks, c = i % chunks;
  float v[32];
  DequantChunk<kType>(w + r * row_bytes, c, v);
  if (to_f16) {
    uint4* out = reinterpret_cast<uint4*>(static_cast<uint16_t*>(dst) + i * 32);
#pragma unroll
    for (int q = 0; q < 4; ++q) out[q] = PackF16x8(v + 8 * q);
    if (dst_lo != nullptr) {
      uint4* lo = reinterpret_cast<uint4*>(static_cast<uint16_t*>(dst_lo) + i * 32);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        Residual8(v + 8 * q);
        lo[q] = PackF16x8(v + 8 * q);
      }
    }
  } else {
    float4* out = reinterpret_cast<float4*>(static_cast<float*>(dst) + i * 32);
#pragma unroll
    for (int q = 0; q < 8; ++q) out[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
  }
}

__global__ void F32ToF16Kernel(const float* src, int64_t count, uint16_t* dst, uint16_t* dst_lo) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const __half b = __float2half_rn(src[i]);
  dst[i] = *reinterpret_cast<const uint16_t*>(&b);
  if (dst_lo != nullptr) {
    const __half l = __float2half_rn(src[i] - __half2float(b));
    dst_lo[i] = *reinterpret_cast<const uint16_t*>(&l);
  }
}

template <uint32_t kType>
cudaError_t Launch(const DeviceMatrix& w, int64_t row_begin, int64_t count, bool to_f16, void* dst, void* dst_lo,
                   cudaStream_t stream) {
  const int64_t chunks = w.cols / 32;
  const int64_t total = count * chunks;
  const int threads = 128;
  DequantizeRowsKernel<kType><<<static_cast<unsigned>((total + threads - 1) / threads), threads, 0, stream>>>(
      static_cast<const uint8_t*>(w.data) + row_begin * w.row_bytes, w.row_bytes, chunks, total,
      to_f16, dst, dst_lo);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchDequantizeRows(const DeviceMatrix& w, int64_t row_begin, int64_t count,
                                 bool to_f16, void* dst, cudaStream_t stream, void* dst_lo) {
  if (dst_lo != nullptr && !to_f16) return cudaErrorInvalidValue;
  if (count <= 0) return cudaSuccess;
  if (row_begin < 0 || row_begin + count > w.rows || !DenseKernelsSupportType(w.type) ||
      w.cols % RowLengthMultiple(w.type) != 0) {
    return cudaErrorInvalidValue;
  }
  switch (w.type) {
    case kTypeF32: return Launch<kTypeF32>(w, row_begin, count, to_f16, dst, dst_lo, stream);
    case kTypeF16: return Launch<kTypeF16>(w, row_begin, count, to_f16, dst, dst_lo, stream);
    case kTypeBF16: return Launch<kTypeBF16>(w, row_begin, count, to_f16, dst, dst_lo, stream);
    case kTypeQ8_0: return Launch<kTypeQ8_0>(w, row_begin, count, to_f16, dst, dst_lo, stream);
    case kTypeQ4_K: return Launch<kTypeQ4_K>(w, row_begin, count, to_f16, dst, dst_lo, stream);
    case kTypeQ5_K: return Launch<kTypeQ5_K>(w, row_begin, count, to_f16, dst, dst_lo, stream);
    case kTypeQ6_K: return Launch<kTypeQ6_K>(w, row_begin, count, to_f16, dst, dst_lo, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchF32ToF16(const float* src, int64_t count, uint16_t* dst, cudaStream_t stream, uint16_t* dst_lo) {
  if (count <= 0) return cudaSuccess;
  F32ToF16Kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(src, count, dst, dst_lo);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
