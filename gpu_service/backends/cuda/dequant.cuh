// Device-side dequantization of the ggml block formats, one "chunk" (32 consecutive elements of a
// row) at a time, for both CUDA kernel families (kernels/: dense matvec, embedding gather,
// dequantize-for-GEMM; moe/: expert matvec and prefill), plus each format's block geometry. Only
// .cu files include this header (no Abseil).
//
// DequantChunk<kType>(row, c, out) writes elements 32c .. 32c + 31 of the row as f32. Every
// supported format has blocks of 1, 32 or 256 elements, so a chunk never straddles blocks (a
// K-quant super-block is eight chunks). Values match DequantizeRow of common/weights up to the
// rounding of a fused multiply-add (the compiler may contract d·q − m).
//
// The loads are as wide as each layout's alignment allows (KernelRowAlignment of
// weight_type_ids.h; the host launchers check it): 16 bytes for F32, F16, BF16, Q4_K and Q5_K
// rows (blocks that are multiples of 16 bytes) and the device-only Q8_0x8, 4 bytes for Q2_K,
// 2 bytes for Q3_K, Q6_K, Q4_0 and Q8_0 (blocks only 2-byte aligned).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEQUANT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEQUANT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/weights/block_layouts.h"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {

// Elements and bytes of one block (F32/F16/BF16: one element), for the row stride
// cols / kElems * kBytes.
template <uint32_t kType>
struct BlockGeometry;
template <> struct BlockGeometry<kTypeF32> { static constexpr int kElems = 1, kBytes = 4; };
template <> struct BlockGeometry<kTypeF16> { static constexpr int kElems = 1, kBytes = 2; };
template <> struct BlockGeometry<kTypeBF16> { static constexpr int kElems = 1, kBytes = 2; };
template <> struct BlockGeometry<kTypeQ4_0> { static constexpr int kElems = 32, kBytes = 18; };
template <> struct BlockGeometry<kTypeQ8_0> { static constexpr int kElems = 32, kBytes = 34; };
template <> struct BlockGeometry<kTypeQ2_K> { static constexpr int kElems = 256, kBytes = 84; };
template <> struct BlockGeometry<kTypeQ3_K> { static constexpr int kElems = 256, kBytes = 110; };
template <> struct BlockGeometry<kTypeQ4_K> { static constexpr int kElems = 256, kBytes = 144; };
template <> struct BlockGeometry<kTypeQ5_K> { static constexpr int kElems = 256, kBytes = 176; };
template <> struct BlockGeometry<kTypeQ6_K> { static constexpr int kElems = 256, kBytes = 210; };
template <> struct BlockGeometry<kTypeQ8_0x8> { static constexpr int kElems = 256, kBytes = 272; };

__device__ __forceinline__ float HalfBits(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
__device__ __forceinline__ uint16_t LoadU16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// Bytes [p, p + 32) with 16-byte loads (p 16-byte aligned).
__device__ __forceinline__ void Load32Aligned16(const uint8_t* p, uint8_t (&b)[32]) {
  const uint4 lo = __ldg(reinterpret_cast<const uint4*>(p));
  const uint4 hi = __ldg(reinterpret_cast<const uint4*>(p) + 1);
  *reinterpret_cast<uint4*>(b) = lo;
  *reinterpret_cast<uint4*>(b + 16) = hi;
}

// Bytes [p, p + kBytes) with 2-byte loads (p 2-byte aligned).
template <int kBytes>
__device__ __forceinline__ void LoadAligned2(const uint8_t* p, uint8_t (&b)[kBytes]) {
#pragma unroll
  for (int i = 0; i < kBytes / 2; ++i) reinterpret_cast<uint16_t*>(b)[i] = __ldg(reinterpret_cast<const uint16_t*>(p) + i);
}

template <uint32_t kType>
__device__ __forceinline__ void DequantChunk(const uint8_t* row, int64_t c, float (&w)[32]);

template <>
__device__ __forceinline__ void DequantChunk<kTypeF32>(const uint8_t* row, int64_t c, float (&w)[32]) {
  const float4* src = reinterpret_cast<const float4*>(row) + c * 8;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 v = __ldg(src + i);
    w[4 * i] = v.x;
    w[4 * i + 1] = v.y;
    w[4 * i + 2] = v.z;
    w[4 * i + 3] = v.w;
  }
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeF16>(const uint8_t* row, int64_t c, float (&w)[32]) {
  const uint4* src = reinterpret_cast<const uint4*>(row + c * 64);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = __ldg(src + i);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[8 * i + 2 * k] = HalfBits(static_cast<uint16_t>(words[k] & 0xFFFF));
      w[8 * i + 2 * k + 1] = HalfBits(static_cast<uint16_t>(words[k] >> 16));
    }
  }
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeBF16>(const uint8_t* row, int64_t c, float (&w)[32]) {
  const uint4* src = reinterpret_cast<const uint4*>(row + c * 64);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = __ldg(src + i);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[8 * i + 2 * k] = __uint_as_float(words[k] << 16);
      w[8 * i + 2 * k + 1] = __uint_as_float(words[k] & 0xFFFF0000u);
    }
  }
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeQ4_0>(const uint8_t* row, int64_t c, float (&w)[32]) {
  const uint8_t* blk = row + c * 18;
  uint8_t b[18];
  LoadAligned2<18>(blk, b);
  const float d = HalfBits(static_cast<uint16_t>(b[0] | (b[1] << 8)));
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    w[j] = ((b[2 + j] & 0xF) - 8) * d;
    w[j + 16] = ((b[2 + j] >> 4) - 8) * d;
  }
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeQ8_0>(const uint8_t* row, int64_t c, float (&w)[32]) {
  const uint8_t* blk = row + c * 34;
  uint8_t b[34];
  LoadAligned2<34>(blk, b);
  const float d = HalfBits(static_cast<uint16_t>(b[0] | (b[1] << 8)));
#pragma unroll
  for (int j = 0; j < 32; ++j) w[j] = static_cast<int8_t>(b[2 + j]) * d;
}

// Q8_0x8 (device_matrix.h): chunk c is block c % 8 of super-block c / 8; 16-byte loads.
template <>
__device__ __forceinline__ void DequantChunk<kTypeQ8_0x8>(const uint8_t* row, int64_t c, float (&w)[32]) {
  const uint8_t* sb = row + (c >> 3) * 272;
  const int j = static_cast<int>(c & 7);
  uint8_t b[32];
  Load32Aligned16(sb + 16 + 32 * j, b);
  const float d = HalfBits(__ldg(reinterpret_cast<const unsigned short*>(sb) + j));
#pragma unroll
  for (int k = 0; k < 32; ++k) w[k] = static_cast<int8_t>(b[k]) * d;
}

// Q2_K: chunk j of a super-block covers elements 32j..32j+31: two-bit field 2·(j % 4) of
// qs[32·(j / 4) + l], sub-block scales 2j and 2j + 1.
template <>
__device__ __forceinline__ void DequantChunk<kTypeQ2_K>(const uint8_t* row, int64_t c, float (&w)[32]) {
  const uint8_t* blk = row + (c >> 3) * 84;
  const int j = static_cast<int>(c & 7);
  uint32_t qs[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) qs[i] = __ldg(reinterpret_cast<const uint32_t*>(blk + 16 + 32 * (j >> 2)) + i);
  const uint16_t sc2 = __ldg(reinterpret_cast<const uint16_t*>(blk) + j);
  const uint32_t dd = __ldg(reinterpret_cast<const uint32_t*>(blk + 80));
  const float d = HalfBits(static_cast<uint16_t>(dd & 0xFFFF));
  const float dmin = HalfBits(static_cast<uint16_t>(dd >> 16));
  const int shift = 2 * (j & 3);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint8_t sc = static_cast<uint8_t>(half == 0 ? (sc2 & 0xFF) : (sc2 >> 8));
    const float dl = d * (sc & 0xF);
    const float ml = dmin * (sc >> 4);
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      const int idx = 16 * half + l;
      const int q = ((qs[idx >> 2] >> (8 * (idx & 3))) >> shift) & 3;
      w[idx] = dl * q - ml;
    }
  }
}

// Q3_K: as Q2_K for the low two bits; the high bit is bit j of hmask[l].
template <>
__device__ __forceinline__ void DequantChunk<kTypeQ3_K>(const uint8_t* row, int64_t c, float (&w)[32]) {
  const uint8_t* blk = row + (c >> 3) * 110;
  const int j = static_cast<int>(c & 7);
  uint8_t hm[32], qs[32], scales[12];
  LoadAligned2<32>(blk, hm);
  LoadAligned2<32>(blk + 32 + 32 * (j >> 2), qs);
  LoadAligned2<12>(blk + 96, scales);
  const float d = HalfBits(LoadU16(blk + 108));
  const int shift = 2 * (j & 3);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float dl = d * UnpackQ3KScale(2 * j + half, scales);
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      const int idx = 16 * half + l;
      const int low = (qs[idx] >> shift) & 3;
      const bool high = (hm[idx] >> j) & 1;
      w[idx] = dl * (low - (high ? 0 : 4));
    }
  }
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeQ4_K>(const uint8_t* row, int64_t c, float (&w)[32]) {
  const uint8_t* blk = row + (c >> 3) * 144;
  const int j = static_cast<int>(c & 7);
  uint8_t q[32];
  Load32Aligned16(blk + 16 + 32 * (j >> 1), q);
  const uint4 head = __ldg(reinterpret_cast<const uint4*>(blk));  // d, dmin, 12 scale bytes
  const uint8_t* hb = reinterpret_cast<const uint8_t*>(&head);
  uint8_t sc, m;
  UnpackKScaleMin(j, hb + 4, &sc, &m);
  const float factor = HalfBits(static_cast<uint16_t>(hb[0] | (hb[1] << 8))) * sc;
  const float offset = HalfBits(static_cast<uint16_t>(hb[2] | (hb[3] << 8))) * m;
  const int shift = 4 * (j & 1);
#pragma unroll
  for (int l = 0; l < 32; ++l) w[l] = factor * ((q[l] >> shift) & 0xF) - offset;
}

template <>
__device__ __forceinline__ void DequantChunk<kTypeQ5_K>(const uint8_t* row, int64_t c, float (&w)[32]) {
  const uint8_t* blk = row + (c >> 3) * 176;
  const int j = static_cast<int>(c & 7);
  uint8_t q[32], qh[32];
  Load32Aligned16(blk + 48 + 32 * (j >> 1), q);
  Load32Aligned16(blk + 16, qh);
  const uint4 head = __ldg(reinterpret_cast<const uint4*>(blk));
  const uint8_t* hb = reinterpret_cast<const uint8_t*>(&head);
  uint8_t sc, m;
  UnpackKScaleMin(j, hb + 4, &sc, &m);
  const float factor = HalfBits(static_cast<uint16_t>(hb[0] | (hb[1] << 8))) * sc;
  const float offset = HalfBits(static_cast<uint16_t>(hb[2] | (hb[3] << 8))) * m;
  const int shift = 4 * (j & 1);
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const int v = ((q[l] >> shift) & 0xF) + (((qh[l] >> j) & 1) ? 16 : 0);
    w[l] = factor * v - offset;
  }
}

// Q6_K: chunk j = 4·half + group.
template <>
__device__ __forceinline__ void DequantChunk<kTypeQ6_K>(const uint8_t* row, int64_t c, float (&w)[32]) {
  const uint8_t* blk = row + (c >> 3) * 210;
  const int j = static_cast<int>(c & 7);
  const int half = j >> 2, group = j & 3;
  uint8_t ql[32], qh[32];
  LoadAligned2<32>(blk + 64 * half + 32 * (group & 1), ql);
  LoadAligned2<32>(blk + 128 + 32 * half, qh);
  const uint16_t sc2 = LoadU16(blk + 192 + 2 * j);
  const float d = HalfBits(LoadU16(blk + 208));
  const int low_shift = group < 2 ? 0 : 4;
#pragma unroll
  for (int hs = 0; hs < 2; ++hs) {
    const float dl = d * static_cast<int8_t>(hs == 0 ? (sc2 & 0xFF) : (sc2 >> 8));
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      const int idx = 16 * hs + l;
      const int low = (ql[idx] >> low_shift) & 0xF;
      const int high = (qh[idx] >> (2 * group)) & 3;
      w[idx] = dl * ((low | (high << 4)) - 32);
    }
  }
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEQUANT_CUH_
