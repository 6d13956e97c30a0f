// Device-side dequantization of the ggml block formats, 32 elements ("a chunk") at a time.
//
// Every supported type splits a row into chunks of 32 consecutive elements: a Q8_0 block is one
// chunk, a K-quant super-block of 256 is eight. DequantChunk<T>(row, c, out) writes elements
// 32c .. 32c+31 of the row as f32, equal to the CPU's DequantizeRow up to the rounding of a fused
// multiply-add (the compiler may contract d·q − m). The loads are as wide as each layout's alignment allows: 16 bytes for F32, BF16,
// Q4_K and Q5_K (whose blocks are multiples of 16 bytes; the caller keeps rows 16-byte aligned),
// 2 bytes for Q8_0 and Q6_K (34- and 210-byte blocks are only 2-byte aligned).
//
// Device-only header (no Abseil): included by the .cu files of embedding, dense_matvec and gemm.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DEQUANT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DEQUANT_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "common/weights/block_layouts.h"
#include "gpu_service/backends/cuda/kernels/kernel_types.cuh"

namespace tandem::cuda {

__device__ __forceinline__ float HalfBitsToFloat(uint16_t h) { return Fp16ToFp32(h); }

// Element e of the 16 bytes v (as a byte array).
__device__ __forceinline__ uint8_t ByteOf(const uint4& v, int e) {
  const uint32_t w = e < 4 ? v.x : e < 8 ? v.y : e < 12 ? v.z : v.w;
  return static_cast<uint8_t>(w >> (8 * (e & 3)));
}

template <int kType>
struct ChunkLayout;

template <>
struct ChunkLayout<kTypeF32> {
  static constexpr int kChunksPerBlock = 1;
  static constexpr int kBlockBytes = 128;  // 32 floats
};
template <>
struct ChunkLayout<kTypeBF16> {
  static constexpr int kChunksPerBlock = 1;
  static constexpr int kBlockBytes = 64;
};
template <>
struct ChunkLayout<kTypeF16> {
  static constexpr int kChunksPerBlock = 1;
  static constexpr int kBlockBytes = 64;
};
template <>
struct ChunkLayout<kTypeQ8_0> {
  static constexpr int kChunksPerBlock = 1;
  static constexpr int kBlockBytes = 34;
};
template <>
struct ChunkLayout<kTypeQ4_K> {
  static constexpr int kChunksPerBlock = 8;
  static constexpr int kBlockBytes = 144;
};
template <>
struct ChunkLayout<kTypeQ5_K> {
  static constexpr int kChunksPerBlock = 8;
  static constexpr int kBlockBytes = 176;
};
template <>
struct ChunkLayout<kTypeQ6_K> {
  static constexpr int kChunksPerBlock = 8;
  static constexpr int kBlockBytes = 210;
};

template <int kType>
__device__ __forceinline__ void DequantChunk(const uint8_t* row, int64_t c, float* out);

template <>
__device__ __forceinline__ void DequantChunk<kTypeF32>(const uint8_t* row, int64_t c, float* out) {
  const float4* p = reinterpret_cast<const float4*>(row + c * 128);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 v = __ldg(p + i);
    out[4 * i] = v.x;
    out[4 * i + 1] = v.y;
    out[4 * i + 2] = v.z;
    out[4 * i + 3] = v.w;
  }
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeBF16>(const uint8_t* row, int64_t c, float* out) {
  const uint4* p = reinterpret_cast<const uint4*>(row + c * 64);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = __ldg(p + i);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
      out[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
    }
  }
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeF16>(const uint8_t* row, int64_t c, float* out) {
  const uint4* p = reinterpret_cast<const uint4*>(row + c * 64);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = __ldg(p + i);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out[8 * i + 2 * j] = HalfBitsToFloat(static_cast<uint16_t>(w[j]));
      out[8 * i + 2 * j + 1] = HalfBitsToFloat(static_cast<uint16_t>(w[j] >> 16));
    }
  }
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeQ8_0>(const uint8_t* row, int64_t c, float* out) {
  const uint16_t* p = reinterpret_cast<const uint16_t*>(row + c * 34);
  const float d = HalfBitsToFloat(__ldg(p));
  uint16_t q[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) q[i] = __ldg(p + 1 + i);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = d * static_cast<float>(static_cast<int8_t>(q[i] & 0xFF));
    out[2 * i + 1] = d * static_cast<float>(static_cast<int8_t>(q[i] >> 8));
  }
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeQ4_K>(const uint8_t* row, int64_t c, float* out) {
  const uint8_t* block = row + (c >> 3) * 144;
  const int j = static_cast<int>(c & 7);  // sub-block of 32
  const uint4 head = __ldg(reinterpret_cast<const uint4*>(block));
  const uint4* qs = reinterpret_cast<const uint4*>(block + 16 + 32 * (j >> 1));
  const uint4 q0 = __ldg(qs), q1 = __ldg(qs + 1);
  uint8_t scales[12];
#pragma unroll
  for (int i = 0; i < 12; ++i) scales[i] = ByteOf(head, 4 + i);
  uint8_t sc, m;
  UnpackKScaleMin(j, scales, &sc, &m);
  const float d = HalfBitsToFloat(static_cast<uint16_t>(head.x)) * sc;
  const float dm = HalfBitsToFloat(static_cast<uint16_t>(head.x >> 16)) * m;
  const int shift = (j & 1) * 4;
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const uint8_t b = l < 16 ? ByteOf(q0, l) : ByteOf(q1, l - 16);
    out[l] = d * static_cast<float>((b >> shift) & 0xF) - dm;
  }
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeQ5_K>(const uint8_t* row, int64_t c, float* out) {
  const uint8_t* block = row + (c >> 3) * 176;
  const int j = static_cast<int>(c & 7);
  const uint4 head = __ldg(reinterpret_cast<const uint4*>(block));
  const uint4 h0 = __ldg(reinterpret_cast<const uint4*>(block + 16));
  const uint4 h1 = __ldg(reinterpret_cast<const uint4*>(block + 32));
  const uint4* qs = reinterpret_cast<const uint4*>(block + 48 + 32 * (j >> 1));
  const uint4 q0 = __ldg(qs), q1 = __ldg(qs + 1);
  uint8_t scales[12];
#pragma unroll
  for (int i = 0; i < 12; ++i) scales[i] = ByteOf(head, 4 + i);
  uint8_t sc, m;
  UnpackKScaleMin(j, scales, &sc, &m);
  const float d = HalfBitsToFloat(static_cast<uint16_t>(head.x)) * sc;
  const float dm = HalfBitsToFloat(static_cast<uint16_t>(head.x >> 16)) * m;
  const int shift = (j & 1) * 4;
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const uint8_t b = l < 16 ? ByteOf(q0, l) : ByteOf(q1, l - 16);
    const uint8_t hb = l < 16 ? ByteOf(h0, l) : ByteOf(h1, l - 16);
    const int q = ((b >> shift) & 0xF) | (((hb >> j) & 1) << 4);
    out[l] = d * static_cast<float>(q) - dm;
  }
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeQ6_K>(const uint8_t* row, int64_t c, float* out) {
  const uint8_t* block = row + (c >> 3) * 210;
  const int j = static_cast<int>(c & 7);
  const int h = j >> 2, g = j & 3;
  const uint16_t* ql = reinterpret_cast<const uint16_t*>(block + 64 * h + 32 * (g & 1));
  const uint16_t* qh = reinterpret_cast<const uint16_t*>(block + 128 + 32 * h);
  const float d = HalfBitsToFloat(__ldg(reinterpret_cast<const uint16_t*>(block + 208)));
  const uint16_t s2 = __ldg(reinterpret_cast<const uint16_t*>(block + 192 + 2 * j));
  const float d0 = d * static_cast<float>(static_cast<int8_t>(s2 & 0xFF));
  const float d1 = d * static_cast<float>(static_cast<int8_t>(s2 >> 8));
  const int lshift = (g >> 1) * 4, hshift = 2 * g;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint16_t l2 = __ldg(ql + i), h2 = __ldg(qh + i);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int l = 2 * i + b;
      const int lo = ((b ? (l2 >> 8) : l2) >> lshift) & 0xF;
      const int hi = ((b ? (h2 >> 8) : h2) >> hshift) & 3;
      out[l] = (l < 16 ? d0 : d1) * static_cast<float>((lo | (hi << 4)) - 32);
    }
  }
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DEQUANT_CUH_
