// The appended router rows of the fused GDN kernel's output product (route_compose.cuh): M =
// wr_gamma · dequant(out) by a tiled f32 product, then each row scaled by a power of two and split
// into two Q8_0 terms written by columns. Load-time work, run once per layer at upload. Why not
// cuBLAS: the right operand is a Q8_0x8 matrix, dequantized here as each tile is loaded (no f32
// copy of W_out), and the product takes ~1 ms a layer either way.
#include "gpu_service/backends/cuda/kernels/route_compose.cuh"

#include <cuda_fp16.h>

#include <cstdint>

namespace tandem::cuda {
namespace {

constexpr int kTile = 64;         // output rows and columns of a block
constexpr int kDepth = 32;        // inner values a step
constexpr int kComposeThreads = 256;  // 16 × 16, a 4 × 4 patch each
constexpr int kQuantThreads = 256;

// W_out[k][c] of a Q8_0x8 row (device_matrix.h: eight f16 scales, then 8 × 32 int8 a super-block).
__device__ __forceinline__ float Q8x8Value(const uint8_t* row, int c) {
  const uint8_t* sb = row + static_cast<int64_t>(c / 256) * kQ8_0x8SuperBytes;
  const int b = (c % 256) / 32;
  const float d = __half2float(*reinterpret_cast<const __half*>(sb + 2 * b));
  return d * static_cast<float>(static_cast<int8_t>(sb[16 + 32 * b + c % 32]));
}

__global__ void __launch_bounds__(kComposeThreads)
ComposeKernel(const float* __restrict__ a, int rows, int inner, const uint8_t* __restrict__ b, int64_t b_row_bytes,
              int cols, float* __restrict__ m) {
  __shared__ float as[kDepth][kTile + 1];  // [k][r]
  __shared__ float bs[kDepth][kTile];      // [k][c]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int r0 = blockIdx.y * kTile, c0 = blockIdx.x * kTile;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < inner; k0 += kDepth) {
    for (int i = threadIdx.x; i < kTile * kDepth; i += kComposeThreads) {
      const int rr = i / kDepth, kk = i % kDepth, r = r0 + rr, k = k0 + kk;
      as[kk][rr] = r < rows && k < inner ? a[static_cast<int64_t>(r) * inner + k] : 0.0f;
    }
    for (int i = threadIdx.x; i < kTile * kDepth; i += kComposeThreads) {
      const int kk = i / kTile, cc = i % kTile, k = k0 + kk, c = c0 + cc;
      bs[kk][cc] = k < inner && c < cols ? Q8x8Value(b + static_cast<int64_t>(k) * b_row_bytes, c) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kDepth; ++kk) {
      float x[4], y[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[i] = as[kk][ty * 4 + i];
        y[i] = bs[kk][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(x[i], y[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = r0 + ty * 4 + i;
    if (r >= rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = c0 + tx * 4 + j;
      if (c < cols) m[static_cast<int64_t>(r) * cols + c] = acc[i][j];
    }
  }
}

// Q8_0 of one lane's value over its warp (32 values = one block): the f16 scale max|v| / 127 and
// the lane's quant, as ggml's quantize_row_q8_0 forms them (the quant from the rounded scale).
__device__ __forceinline__ void QuantizeQ8Warp(float v, __half* scale, int8_t* q) {
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  *scale = __float2half_rn(amax / 127.0f);
  const float d = __half2float(*scale);
  const float r = d > 0.0f ? rintf(v / d) : 0.0f;
  *q = static_cast<int8_t>(fminf(127.0f, fmaxf(-127.0f, r)));
}

// Block r: row r of M (zeros past `rows`) as its two terms (route_compose.cuh).
__global__ void __launch_bounds__(kQuantThreads)
QuantizeRouteRowsKernel(const float* __restrict__ m, int rows, int cols, uint8_t* __restrict__ dst, int64_t row_bytes,
                        int64_t group_bytes, int64_t hi_row, int64_t lo_row, float* __restrict__ inv_scale) {
  __shared__ float part[kQuantThreads / 32];
  const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* row = m + static_cast<int64_t>(r) * cols;
  float amax = 0.0f;
  if (r < rows) {
    for (int c = tid; c < cols; c += kQuantThreads) amax = fmaxf(amax, fabsf(row[c]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  if (lane == 0) part[warp] = amax;
  __syncthreads();
  amax = 0.0f;
#pragma unroll
  for (int w = 0; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, part[w]);
  int e = 0;
  if (amax > 0.0f) (void)frexpf(amax, &e);  // amax = f·2^e, f in [0.5, 1)
  if (tid == 0) inv_scale[r] = amax > 0.0f ? ldexpf(1.0f, e) : 0.0f;
  for (int blk = warp; blk < cols / 32; blk += kQuantThreads / 32) {
    const int c = blk * 32 + lane;
    const float v = amax > 0.0f ? ldexpf(row[c], -e) : 0.0f;
    uint8_t* hi = dst + (hi_row + r) * row_bytes + static_cast<int64_t>(c / 256) * group_bytes;
    uint8_t* lo = dst + (lo_row + r) * row_bytes + static_cast<int64_t>(c / 256) * group_bytes;
    const int b = blk % 8;
    __half d_hi, d_lo;
    int8_t q_hi, q_lo;
    QuantizeQ8Warp(v, &d_hi, &q_hi);
    const float rest = fmaf(-static_cast<float>(q_hi), __half2float(d_hi), v) * 256.0f;
    QuantizeQ8Warp(rest, &d_lo, &q_lo);
    hi[16 + 32 * b + lane] = static_cast<uint8_t>(q_hi);
    lo[16 + 32 * b + lane] = static_cast<uint8_t>(q_lo);
    if (lane == 0) {
      *reinterpret_cast<__half*>(hi + 2 * b) = d_hi;
      *reinterpret_cast<__half*>(lo + 2 * b) = d_lo;
    }
  }
}

}  // namespace

cudaError_t ComposeRouteRows(const float* wr_gamma, int64_t R, const DeviceMatrix& out, const RouteRowsTarget& to,
                             float* inv_scale, float* scratch, cudaStream_t stream) {
  const int64_t padded = RoutePaddedRows(R);
  if (wr_gamma == nullptr || to.data == nullptr || inv_scale == nullptr || scratch == nullptr || R <= 0 ||
      !Q8_0x8RowsAligned(out) || out.rows <= 0 || to.row_bytes < kQ8_0x8SuperBytes || to.group_bytes < kQ8_0x8SuperBytes ||
      to.first_row < 0 || out.cols > (1 << 24) || out.rows > (1 << 24) || R > (1 << 20)) {
    return cudaErrorInvalidValue;
  }
  const int rows = static_cast<int>(R), inner = static_cast<int>(out.rows), cols = static_cast<int>(out.cols);
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  ComposeKernel<<<grid, kComposeThreads, 0, stream>>>(wr_gamma, rows, inner, static_cast<const uint8_t*>(out.data),
                                                       out.row_bytes, cols, scratch);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  QuantizeRouteRowsKernel<<<static_cast<unsigned>(padded), kQuantThreads, 0, stream>>>(
      scratch, rows, cols, static_cast<uint8_t*>(to.data), to.row_bytes, to.group_bytes, to.first_row,
      to.first_row + padded, inv_scale);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
