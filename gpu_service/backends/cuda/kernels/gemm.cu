#include "gpu_service/backends/cuda/kernels/gemm.cuh"

#include <cuda_fp16.h>

#include <atomic>

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/pdl.cuh"

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
  PdlWaitForPrevious();  // pdl.cuh: src is the step's
  PdlAllowNext();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const __half b = __float2half_rn(src[i]);
  dst[i] = *reinterpret_cast<const uint16_t*>(&b);
  if (dst_lo != nullptr) {
    const __half l = __float2half_rn(src[i] - __half2float(b));
    dst_lo[i] = *reinterpret_cast<const uint16_t*>(&l);
  }
}

// F32ToF16Kernel over 8 values a thread (count / 8 threads): two 16-byte loads, one 16-byte store
// (and one for dst_lo), for 16-byte aligned pointers and count % 8 == 0. The same per-value
// roundings as F32ToF16Kernel (f16 of the value, then of value − hi: PackF16x8, Residual8), so the
// same bits; F32ToF16Kernel's one 4-byte load and 2-byte store per thread left it at ~160 us for
// 8192 × 4096 values on the H200 (~45 us of bytes).
__global__ void F32ToF16x8Kernel(const float* src, int64_t groups, uint16_t* dst, uint16_t* dst_lo) {
  PdlWaitForPrevious();  // pdl.cuh: src is the step's
  PdlAllowNext();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= groups) return;
  const float4* s = reinterpret_cast<const float4*>(src) + 2 * i;
  const float4 a = s[0], b = s[1];
  float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  reinterpret_cast<uint4*>(dst)[i] = PackF16x8(v);
  if (dst_lo != nullptr) {
    Residual8(v);
    reinterpret_cast<uint4*>(dst_lo)[i] = PackF16x8(v);
  }
}

std::atomic<bool>& OldF32ToF16Switch() {
  static std::atomic<bool> old{EnvSwitch("TANDEM_OLD_F32_TO_F16")};
  return old;
}

// The persistent copy DenseGemm::Prepare makes (gemm.cuh): one thread per 32-element chunk,
// values times `scale` (a power of two: exact) rounded to f16 hi, and with copies >= 2 the
// residual lo after it in the same row, with copies == 3 hi once more.
template <uint32_t kType>
__global__ void DequantizeToF16LayoutKernel(const uint8_t* w, int64_t row_bytes, int64_t cols, int64_t chunks,
                                            int64_t total, int copies, float scale, uint16_t* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t r = i / chunks, c = i % chunks;
  float v[32];
  DequantChunk<kType>(w + r * row_bytes, c, v);
#pragma unroll
  for (int e = 0; e < 32; ++e) v[e] *= scale;
  uint16_t* row = dst + r * copies * cols + c * 32;
  uint4 hi[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) hi[q] = PackF16x8(v + 8 * q);
#pragma unroll
  for (int q = 0; q < 4; ++q) reinterpret_cast<uint4*>(row)[q] = hi[q];
  if (copies == 3) {
#pragma unroll
    for (int q = 0; q < 4; ++q) reinterpret_cast<uint4*>(row + 2 * cols)[q] = hi[q];
  }
  if (copies >= 2) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      Residual8(v + 8 * q);
      reinterpret_cast<uint4*>(row + cols)[q] = PackF16x8(v + 8 * q);
    }
  }
}

// max |w| of a matrix: per-thread maxima of 32-element chunks, one atomic per warp. Non-negative
// floats order like their bit patterns, so the maximum is an unsigned atomicMax (a NaN, whose
// bits exceed infinity's, wins: the host treats a non-finite maximum as "do not scale").
template <uint32_t kType>
__global__ void MaxAbsKernel(const uint8_t* w, int64_t row_bytes, int64_t chunks, int64_t total,
                             unsigned int* max_bits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned int m = 0;
  if (i < total) {
    float v[32];
    DequantChunk<kType>(w + (i / chunks) * row_bytes, i % chunks, v);
#pragma unroll
    for (int e = 0; e < 32; ++e) m = max(m, __float_as_uint(fabsf(v[e])));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(max_bits, m);
}

// Activation rows as split rows [f16(x − f16(x)) | f16(x) | f16(x)] (gemm.cuh: the partner of the
// [hi | lo | hi] and [hi | lo] weight rows): one thread per 8 consecutive values of a row, 16-byte
// stores when the row length and the source allow them.
template <bool kVector>
__global__ void F32ToF16SplitRowsKernel(const float* src, int64_t n, int64_t cols, uint16_t* dst) {
  PdlWaitForPrevious();  // pdl.cuh: src is the step's
  PdlAllowNext();
  const int64_t groups = kVector ? cols / 8 : cols;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * groups) return;
  const int64_t t = i / groups, c = (i % groups) * (kVector ? 8 : 1);
  uint16_t* row = dst + t * 3 * cols + c;
  if constexpr (kVector) {
    const float4* s = reinterpret_cast<const float4*>(src + t * cols + c);
    const float4 a = s[0], b = s[1];
    float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    const uint4 hi = PackF16x8(v);
    *reinterpret_cast<uint4*>(row + kSplitHiThird * cols) = hi;
    *reinterpret_cast<uint4*>(row + (kSplitHiThird + 1) * cols) = hi;
    Residual8(v);
    *reinterpret_cast<uint4*>(row + kSplitLoThird * cols) = PackF16x8(v);
  } else {
    const float x = src[t * cols + c];
    const __half h = __float2half_rn(x);
    const __half l = __float2half_rn(x - __half2float(h));
    row[kSplitHiThird * cols] = row[(kSplitHiThird + 1) * cols] = __half_as_ushort(h);
    row[kSplitLoThird * cols] = __half_as_ushort(l);
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

template <uint32_t kType>
cudaError_t LaunchLayout(const DeviceMatrix& w, int copies, float scale, uint16_t* dst, cudaStream_t stream) {
  const int64_t chunks = w.cols / 32;
  const int64_t total = w.rows * chunks;
  const int threads = 128;
  DequantizeToF16LayoutKernel<kType><<<static_cast<unsigned>((total + threads - 1) / threads), threads, 0, stream>>>(
      static_cast<const uint8_t*>(w.data), w.row_bytes, w.cols, chunks, total, copies, scale, dst);
  return cudaGetLastError();
}

template <uint32_t kType>
cudaError_t LaunchMax(const DeviceMatrix& w, unsigned int* max_bits, cudaStream_t stream) {
  const int64_t chunks = w.cols / 32;
  const int64_t total = w.rows * chunks;
  const int threads = 256;
  MaxAbsKernel<kType><<<static_cast<unsigned>((total + threads - 1) / threads), threads, 0, stream>>>(
      static_cast<const uint8_t*>(w.data), w.row_bytes, chunks, total, max_bits);
  return cudaGetLastError();
}

bool DequantizableWhole(const DeviceMatrix& w) {
  return w.data != nullptr && w.rows > 0 && DenseKernelsSupportType(w.type) && w.cols > 0 &&
         w.cols % RowLengthMultiple(w.type) == 0 && w.rows * (w.cols / 32) < (int64_t{1} << 31) * 128;
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
  return DispatchOnType(w.type, DenseWeightTypes{}, cudaErrorInvalidValue, [&](auto t) {
    return Launch<decltype(t)::value>(w, row_begin, count, to_f16, dst, dst_lo, stream);
  });
}

bool OldF32ToF16() { return OldF32ToF16Switch().load(std::memory_order_relaxed); }
void SetOldF32ToF16(bool on) { OldF32ToF16Switch().store(on, std::memory_order_relaxed); }

cudaError_t LaunchF32ToF16(const float* src, int64_t count, uint16_t* dst, cudaStream_t stream, uint16_t* dst_lo) {
  if (count <= 0) return cudaSuccess;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (count % 8 == 0 && aligned(src) && aligned(dst) && aligned(dst_lo) && !OldF32ToF16()) {
    const int64_t groups = count / 8;
    return LaunchPrefillPdl(F32ToF16x8Kernel, static_cast<unsigned>((groups + 255) / 256), 256, 0, stream, src, groups,
                            dst, dst_lo);
  }
  return LaunchPrefillPdl(F32ToF16Kernel, static_cast<unsigned>((count + 255) / 256), 256, 0, stream, src, count, dst, dst_lo);
}

}  // namespace tandem::cuda

namespace tandem::cuda {

cudaError_t LaunchDequantizeToF16Layout(const DeviceMatrix& w, int copies, float scale, uint16_t* dst,
                                        cudaStream_t stream) {
  if (copies < 1 || copies > 3 || dst == nullptr || !DequantizableWhole(w)) return cudaErrorInvalidValue;
  return DispatchOnType(w.type, DenseWeightTypes{}, cudaErrorInvalidValue,
                        [&](auto t) { return LaunchLayout<decltype(t)::value>(w, copies, scale, dst, stream); });
}

cudaError_t LaunchMaxAbs(const DeviceMatrix& w, unsigned int* max_bits, cudaStream_t stream) {
  if (max_bits == nullptr || !DequantizableWhole(w)) return cudaErrorInvalidValue;
  return DispatchOnType(w.type, DenseWeightTypes{}, cudaErrorInvalidValue,
                        [&](auto t) { return LaunchMax<decltype(t)::value>(w, max_bits, stream); });
}

cudaError_t LaunchF32ToF16SplitRows(const float* src, int64_t n, int64_t cols, uint16_t* dst, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (cols <= 0 || src == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  const int threads = 256;
  // 16-byte loads and stores need 8-value groups that start 16-byte aligned in source and target.
  const bool vector = cols % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const int64_t work = vector ? n * (cols / 8) : n * cols;
  const unsigned blocks = static_cast<unsigned>((work + threads - 1) / threads);
  return vector ? LaunchPrefillPdl(F32ToF16SplitRowsKernel<true>, blocks, threads, 0, stream, src, n, cols, dst)
                : LaunchPrefillPdl(F32ToF16SplitRowsKernel<false>, blocks, threads, 0, stream, src, n, cols, dst);
}

}  // namespace tandem::cuda

namespace tandem::cuda {
namespace {

// One thread per 8 consecutive activations of a row (kVector: 16-byte loads and stores), the
// SiLU as the f32 expert kernels compute it; thread 0 of each row also copies the gate logit.
template <bool kVector>
__global__ void SiluMulToF16RowsKernel(const float* gu, int64_t n, int64_t ld, int64_t ffn, bool split, uint16_t* dst,
                                       int64_t gate_col, float* gate_out) {
  PdlWaitForPrevious();  // pdl.cuh: gu is the step's
  PdlAllowNext();
  constexpr int kPer = kVector ? 8 : 1;
  const int64_t groups = ffn / kPer;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * groups) return;
  const int64_t t = i / groups, c = (i % groups) * kPer;
  const float* g = gu + t * ld + c;
  const float* u = g + ffn;
  if (gate_out != nullptr && c == 0) gate_out[t] = gu[t * ld + gate_col];
  float v[kPer];
  if constexpr (kVector) {
    const float4 g0 = reinterpret_cast<const float4*>(g)[0], g1 = reinterpret_cast<const float4*>(g)[1];
    const float4 u0 = reinterpret_cast<const float4*>(u)[0], u1 = reinterpret_cast<const float4*>(u)[1];
    const float gv[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
    const float uv[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = gv[e] / (1.0f + expf(-gv[e])) * uv[e];
  } else {
    v[0] = g[0] / (1.0f + expf(-g[0])) * u[0];
  }
  uint16_t* row = dst + t * (split ? 3 : 1) * ffn + c;
  if constexpr (kVector) {
    const uint4 hi = PackF16x8(v);
    if (split) {
      *reinterpret_cast<uint4*>(row + kSplitHiThird * ffn) = hi;
      *reinterpret_cast<uint4*>(row + (kSplitHiThird + 1) * ffn) = hi;
      Residual8(v);
      *reinterpret_cast<uint4*>(row + kSplitLoThird * ffn) = PackF16x8(v);
    } else {
      *reinterpret_cast<uint4*>(row) = hi;
    }
  } else {
    const __half h = __float2half_rn(v[0]);
    if (split) {
      row[kSplitHiThird * ffn] = row[(kSplitHiThird + 1) * ffn] = __half_as_ushort(h);
      row[kSplitLoThird * ffn] = __half_as_ushort(__float2half_rn(v[0] - __half2float(h)));
    } else {
      row[0] = __half_as_ushort(h);
    }
  }
}

}  // namespace

cudaError_t LaunchSiluMulToF16Rows(const float* gu, int64_t n, int64_t ld, int64_t ffn, bool split, uint16_t* dst,
                                   int64_t gate_col, float* gate_out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (gu == nullptr || dst == nullptr || ffn <= 0 || ld < 2 * ffn ||
      (gate_out != nullptr && (gate_col < 0 || gate_col >= ld))) {
    return cudaErrorInvalidValue;
  }
  const int threads = 256;
  const bool vector = ffn % 8 == 0 && ld % 4 == 0 && reinterpret_cast<uintptr_t>(gu) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const int64_t work = vector ? n * (ffn / 8) : n * ffn;
  const unsigned blocks = static_cast<unsigned>((work + threads - 1) / threads);
  const cudaError_t err =
      vector ? LaunchPrefillPdl(SiluMulToF16RowsKernel<true>, blocks, threads, 0, stream, gu, n, ld, ffn, split, dst, gate_col,
                         gate_out)
             : LaunchPrefillPdl(SiluMulToF16RowsKernel<false>, blocks, threads, 0, stream, gu, n, ld, ffn, split, dst, gate_col,
                         gate_out);
  return err;
}

}  // namespace tandem::cuda
