#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/matvec_core.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// The generic kernel (F32, F16, BF16, and the quantized types when the fast kernel of
// matvec_core.cuh cannot take the shape): one warp per output row; lane l takes the row's 32-element chunks l, l+32, ... and dots each
// dequantized chunk with kRows activation rows (rows >= n are skipped). Two chunks are loaded per
// iteration so that each lane has two independent weight loads in flight.
template <uint32_t kType, int kRows>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
DenseMatVecKernel(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t chunks, const float* x,
                  int64_t x_stride, int n, float* y, int64_t y_stride) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const uint8_t* row = w + r * row_bytes;
  float acc[kRows];
#pragma unroll
  for (int t = 0; t < kRows; ++t) acc[t] = 0.0f;
  for (int64_t c = lane; c < chunks; c += 64) {
    float v0[32], v1[32];
    const bool second = c + 32 < chunks;
    DequantChunk<kType>(row, c, v0);
    if (second) DequantChunk<kType>(row, c + 32, v1);
#pragma unroll
    for (int t = 0; t < kRows; ++t) {
      if (t < n) {
        const float4* xa = reinterpret_cast<const float4*>(x + t * x_stride + c * 32);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float4 a = __ldg(xa + i);
          sum = fmaf(v0[4 * i], a.x, sum);
          sum = fmaf(v0[4 * i + 1], a.y, sum);
          sum = fmaf(v0[4 * i + 2], a.z, sum);
          sum = fmaf(v0[4 * i + 3], a.w, sum);
        }
        if (second) {
          const float4* xb = xa + 8 * 32;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float4 a = __ldg(xb + i);
            sum = fmaf(v1[4 * i], a.x, sum);
            sum = fmaf(v1[4 * i + 1], a.y, sum);
            sum = fmaf(v1[4 * i + 2], a.z, sum);
            sum = fmaf(v1[4 * i + 3], a.w, sum);
          }
        }
        acc[t] += sum;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    float s = acc[t];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    if (lane == 0 && t < n) y[t * y_stride + r] = s;
  }
}

template <uint32_t kType, int kRows>
cudaError_t Launch(const DeviceMatrix& w, const float* x, int64_t x_stride, int n, float* y,
                   int64_t y_stride, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  DenseMatVecKernel<kType, kRows><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
      static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols / 32, x, x_stride, n, y,
      y_stride);
  return cudaGetLastError();
}

// Activation rows are rounded up to 1, 2, 4 or 8 (rows beyond n cost nothing but registers).
template <uint32_t kType>
cudaError_t LaunchType(const DeviceMatrix& w, const float* x, int64_t x_stride, int n, float* y,
                       int64_t y_stride, cudaStream_t stream) {
  if (n == 1) return Launch<kType, 1>(w, x, x_stride, n, y, y_stride, stream);
  if (n == 2) return Launch<kType, 2>(w, x, x_stride, n, y, y_stride, stream);
  if (n <= 4) return Launch<kType, 4>(w, x, x_stride, n, y, y_stride, stream);
  return Launch<kType, 8>(w, x, x_stride, n, y, y_stride, stream);
}

// Quantized types: the fast kernel when the matrix has the natural row stride and one activation
// row fits its shared memory, else the generic kernel.
template <uint32_t kType>
cudaError_t LaunchQuant(const DeviceMatrix& w, const float* x, int64_t x_stride, int n, float* y, int64_t y_stride,
                        cudaStream_t stream) {
  using F = typename fastmv::FormatOf<kType>::Type;
  const int64_t natural = w.cols / BlockGeometry<kType>::kElems * BlockGeometry<kType>::kBytes;
  if (!fastmv::ForceGeneric() && w.row_bytes == natural && w.cols <= (1 << 20) && w.rows < (int64_t{1} << 31) &&
      fastmv::SharedBytesFor<F>(1, static_cast<int>(w.cols)) <= fastmv::kMaxFastShared) {
    return fastmv::LaunchFastDense<F>(static_cast<const uint8_t*>(w.data), static_cast<int>(w.cols),
                                      static_cast<int>(w.rows), x, x_stride, n, y, y_stride, stream);
  }
  return LaunchType<kType>(w, x, x_stride, n, y, y_stride, stream);
}

}  // namespace

cudaError_t LaunchDenseMatVec(const DeviceMatrix& w, const float* x, int64_t x_stride, int n,
                              float* y, int64_t y_stride, cudaStream_t stream) {
  if (n < 1 || n > kMatVecMaxRows || w.rows <= 0 || !DenseKernelsSupportType(w.type) ||
      w.cols % RowLengthMultiple(w.type) != 0 || x_stride % 4 != 0) {
    return cudaErrorInvalidValue;
  }
  switch (w.type) {
    case kTypeF32: return LaunchType<kTypeF32>(w, x, x_stride, n, y, y_stride, stream);
    case kTypeF16: return LaunchType<kTypeF16>(w, x, x_stride, n, y, y_stride, stream);
    case kTypeBF16: return LaunchType<kTypeBF16>(w, x, x_stride, n, y, y_stride, stream);
    case kTypeQ8_0: return LaunchQuant<kTypeQ8_0>(w, x, x_stride, n, y, y_stride, stream);
    case kTypeQ4_K: return LaunchQuant<kTypeQ4_K>(w, x, x_stride, n, y, y_stride, stream);
    case kTypeQ5_K: return LaunchQuant<kTypeQ5_K>(w, x, x_stride, n, y, y_stride, stream);
    case kTypeQ6_K: return LaunchQuant<kTypeQ6_K>(w, x, x_stride, n, y, y_stride, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda
