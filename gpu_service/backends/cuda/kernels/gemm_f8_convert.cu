#include "gpu_service/backends/cuda/kernels/gemm_f8_convert.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kE4m3Max = 448.0f;

// The exponent e of s = 2^e, the largest power of two with s · amax <= 448; 0 (s = 1) for a zero or
// non-finite amax (NaN inputs then stay NaN in the products, as in the f16 path). The division
// may round up across a power of two: the check after it steps back.
__device__ __forceinline__ int F8ScaleExponent(unsigned int amax_bits) {
  const float amax = __uint_as_float(amax_bits);
  if (!(amax > 0.0f) || !isfinite(amax)) return 0;
  int e = 0;
  frexpf(kE4m3Max / amax, &e);  // 448 / amax = m · 2^e, m in [0.5, 1)
  e = min(max(e - 1, -100), 100);
  if (amax * ldexpf(1.0f, e) > kE4m3Max) --e;
  return e;
}

// The scale exponent of this call, read once per block; the last block to read it puts *amax_bits
// and *done back to 0 (so no memset launch precedes the next call's amax kernel). The fence orders
// each block's read before its count: the reset cannot overtake a read.
__device__ __forceinline__ int TakeF8ScaleExponent(unsigned int* amax_bits, unsigned int* done) {
  __shared__ int e;
  if (threadIdx.x == 0) {
    e = F8ScaleExponent(*reinterpret_cast<volatile unsigned int*>(amax_bits));
    __threadfence();
    if (atomicAdd(done, 1u) == gridDim.x - 1) {
      *amax_bits = 0u;
      *done = 0u;
    }
  }
  __syncthreads();
  return e;
}

// Eight floats to e4m3 (round to nearest even, saturating) in 8 bytes.
__device__ __forceinline__ uint2 PackE4m3x8(const float* v, float s) {
  uint32_t w[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const __nv_fp8x2_storage_t a = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * h] * s, v[4 * h + 1] * s),
                                                            __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t b = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * h + 2] * s, v[4 * h + 3] * s),
                                                            __NV_SATFINITE, __NV_E4M3);
    w[h] = static_cast<uint32_t>(a) | (static_cast<uint32_t>(b) << 16);
  }
  return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ void UnpackF16x8(uint4 p, float* v) {
  const uint32_t w[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[e]));
    v[2 * e] = f.x;
    v[2 * e + 1] = f.y;
  }
}

// Grid-stride max of |hi| over groups of 8, one atomicMax per block.
__global__ void F8AmaxKernel(const uint16_t* rows, int64_t n, int64_t cols, unsigned int* amax_bits) {
  PdlWaitForPrevious();  // pdl.cuh: the rows are the step's
  PdlAllowNext();
  __shared__ float scratch[32];
  const int64_t groups = cols / 8, total = n * groups;
  float m = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / groups, c = (i % groups) * 8;
    float v[8];
    UnpackF16x8(*reinterpret_cast<const uint4*>(rows + t * 3 * cols + kSplitHiThird * cols + c), v);
#pragma unroll
    for (int e = 0; e < 8; ++e) m = fmaxf(m, fabsf(v[e]));  // fmaxf drops NaN: see below
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (isnan(v[e])) m = __int_as_float(0x7f800000);  // a NaN input: s = 1 (F8ScaleExponent)
    }
  }
  m = BlockMax(m, scratch, 0.0f);
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

// The F8 row of each split row from its hi and lo thirds.
__global__ void SplitRowsToF8Kernel(const uint16_t* rows, int64_t n, int64_t cols, unsigned int* amax_bits,
                                    unsigned int* done, uint8_t* dst8, float* b_scale) {
  PdlWaitForPrevious();  // pdl.cuh: amax and the rows are the step's
  PdlAllowNext();
  const int e = TakeF8ScaleExponent(amax_bits, done);
  const int64_t groups = cols / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i == 0) *b_scale = ldexpf(1.0f, -(e + 11));
  if (i >= n * groups) return;
  const int64_t t = i / groups, c = (i % groups) * 8;
  const uint16_t* row = rows + t * 3 * cols;
  float hi[8], lo[8];
  UnpackF16x8(*reinterpret_cast<const uint4*>(row + kSplitHiThird * cols + c), hi);
  UnpackF16x8(*reinterpret_cast<const uint4*>(row + kSplitLoThird * cols + c), lo);
  uint8_t* f8 = dst8 + t * 2 * cols;
  *reinterpret_cast<uint2*>(f8 + c) = PackE4m3x8(lo, ldexpf(1.0f, e + 11));
  *reinterpret_cast<uint2*>(f8 + cols + c) = PackE4m3x8(hi, ldexpf(1.0f, e));
}

__global__ void SplitWeightsToF8Kernel(const uint16_t* src, int64_t rows, int64_t cols, float s_w, uint16_t* hi_dst,
                                       uint8_t* f8_dst) {
  const int64_t groups = cols / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * groups) return;
  const int64_t r = i / groups, c = (i % groups) * 8;
  const uint4 hp = *reinterpret_cast<const uint4*>(src + r * 2 * cols + c);
  const uint4 lp = *reinterpret_cast<const uint4*>(src + r * 2 * cols + cols + c);
  *reinterpret_cast<uint4*>(hi_dst + r * cols + c) = hp;
  float hi[8], lo[8];
  UnpackF16x8(hp, hi);
  UnpackF16x8(lp, lo);
  uint8_t* f8 = f8_dst + r * 2 * cols;
  *reinterpret_cast<uint2*>(f8 + c) = PackE4m3x8(hi, s_w);
  *reinterpret_cast<uint2*>(f8 + cols + c) = PackE4m3x8(lo, s_w * 2048.0f);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

unsigned Blocks(int64_t work) { return static_cast<unsigned>(std::max<int64_t>(1, (work + kThreads - 1) / kThreads)); }

// The amax kernels loop: enough blocks to fill the GPU a few times over, no more.
unsigned AmaxBlocks(int64_t work) { return static_cast<unsigned>(std::min<int64_t>(Blocks(work), 132 * 8)); }

}  // namespace

cudaError_t LaunchF8AmaxSplitRows(const uint16_t* rows, int64_t n, int64_t cols, unsigned int* amax_bits,
                                  cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (rows == nullptr || amax_bits == nullptr || cols <= 0 || cols % 8 != 0 || !Aligned16(rows)) {
    return cudaErrorInvalidValue;
  }
  return LaunchPrefillPdl(F8AmaxKernel, AmaxBlocks(n * cols / 8), kThreads, 0, stream, rows, n, cols, amax_bits);
}

cudaError_t LaunchSplitRowsToF8(const uint16_t* rows, int64_t n, int64_t cols, unsigned int* amax_bits,
                                unsigned int* done, uint8_t* dst8, float* b_scale, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (rows == nullptr || amax_bits == nullptr || done == nullptr || dst8 == nullptr || b_scale == nullptr ||
      cols <= 0 || cols % 8 != 0 || !Aligned16(rows) || !Aligned16(dst8)) {
    return cudaErrorInvalidValue;
  }
  return LaunchPrefillPdl(SplitRowsToF8Kernel, Blocks(n * cols / 8), kThreads, 0, stream, rows, n, cols, amax_bits, done, dst8,
                   b_scale);
}

cudaError_t LaunchSplitWeightsToF8(const uint16_t* src, int64_t rows, int64_t cols, float s_w, uint16_t* hi_dst,
                                   uint8_t* f8_dst, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (src == nullptr || hi_dst == nullptr || f8_dst == nullptr || cols <= 0 || cols % 8 != 0 || !Aligned16(src) ||
      !Aligned16(hi_dst) || !Aligned16(f8_dst)) {
    return cudaErrorInvalidValue;
  }
  SplitWeightsToF8Kernel<<<Blocks(rows * cols / 8), kThreads, 0, stream>>>(src, rows, cols, s_w, hi_dst, f8_dst);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
