// The templated matrix-vector kernels behind matvec.cuh; matvec_*.cu instantiate them per weight
// type so that the instantiations compile in parallel.
//
// Dense launches of Q8_0, Q4_K, Q5_K and Q6_K take the fast kernel of ../matvec_core.cuh, Q4_K
// expert units the kernel of expert_decode.cuh (matvec.cu routes them); everything else the
// generic kernel below (one DequantChunk per lane and piece).
//
// Generic geometry: 256 threads (8 warps). A row of `cols` inputs is 32-element pieces; each output row is
// owned by a group of `lpr` lanes (32 when the row has at least 32 pieces, else the largest power
// of two not above its piece count), so a warp computes 32 / lpr rows and a block 8 times that.
// The activation rows sit in shared memory with 4 floats of padding after every 32 so that the
// lanes' 16-byte reads of different pieces fall in different banks.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MATVEC_IMPL_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MATVEC_IMPL_CUH_

#include <cuda_runtime.h>

#include <type_traits>

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/matvec_core.cuh"
#include "gpu_service/backends/cuda/moe/expert_unit.h"

namespace tandem::cuda {

inline constexpr int kMatVecThreads = 256;
inline constexpr int kPieceStride = 36;  // floats per 32-element piece in shared memory

enum class MatVecMode { kDense, kGateUp, kDown };

struct MatVecArgs {
  MatVecMode mode;
  const void* w;             // kDense: the matrix
  const ExpertUnit* units;   // kGateUp / kDown
  int num_units;             // kGateUp / kDown
  int max_rows;              // rows per unit (bound), or dense activation rows n
  int cols;
  int out_rows;
  const float* in;
  float* out;
  cudaStream_t stream;
  const int* device_num_units;  // kGateUp / kDown: units at index >= *device_num_units return at once
};

__device__ __forceinline__ float SiluF(float g) { return g * (1.0f / (1.0f + expf(-g))); }

// Rows per lane group: 32 lanes when possible.
__host__ __device__ inline int LanesPerRow(int pieces) {
  int lpr = 32;
  while (lpr > pieces) lpr >>= 1;
  return lpr;
}

template <uint32_t kType, int kM, bool kFused>
__device__ __forceinline__ void MatVecBlock(const uint8_t* w0, const uint8_t* w1, int cols, int out_rows,
                                            int rows_used, const float* xs, float* out) {
  constexpr int64_t kBytes = BlockGeometry<kType>::kBytes;
  constexpr int64_t kElems = BlockGeometry<kType>::kElems;
  const int64_t row_bytes = static_cast<int64_t>(cols) / kElems * kBytes;
  const int pieces = cols / 32;
  const int lpr = LanesPerRow(pieces);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int groups = 32 / lpr;
  const int group = lane / lpr, gl = lane % lpr;
  const int row = (blockIdx.x * (kMatVecThreads / 32) + warp) * groups + group;
  const int xs_stride = pieces * kPieceStride;
  float acc0[kM], acc1[kM];
#pragma unroll
  for (int r = 0; r < kM; ++r) acc0[r] = acc1[r] = 0.0f;
  if (row < out_rows) {
    const uint8_t* r0 = w0 + row * row_bytes;
    const uint8_t* r1 = kFused ? w1 + row * row_bytes : nullptr;
    for (int p = gl; p < pieces; p += lpr) {
      float wv[32];
      DequantChunk<kType>(r0, p, wv);
#pragma unroll
      for (int r = 0; r < kM; ++r) {
        if (kM > 1 && r >= rows_used) break;
        const float4* xp = reinterpret_cast<const float4*>(xs + r * xs_stride + p * kPieceStride);
        float a = acc0[r];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float4 xv = xp[i];
          a = fmaf(wv[4 * i], xv.x, a);
          a = fmaf(wv[4 * i + 1], xv.y, a);
          a = fmaf(wv[4 * i + 2], xv.z, a);
          a = fmaf(wv[4 * i + 3], xv.w, a);
        }
        acc0[r] = a;
      }
      if (kFused) {
        DequantChunk<kType>(r1, p, wv);
#pragma unroll
        for (int r = 0; r < kM; ++r) {
          if (kM > 1 && r >= rows_used) break;
          const float4* xp = reinterpret_cast<const float4*>(xs + r * xs_stride + p * kPieceStride);
          float a = acc1[r];
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float4 xv = xp[i];
            a = fmaf(wv[4 * i], xv.x, a);
            a = fmaf(wv[4 * i + 1], xv.y, a);
            a = fmaf(wv[4 * i + 2], xv.z, a);
            a = fmaf(wv[4 * i + 3], xv.w, a);
          }
          acc1[r] = a;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kM; ++r) {
    for (int off = lpr / 2; off > 0; off >>= 1) {
      acc0[r] += __shfl_xor_sync(0xFFFFFFFFu, acc0[r], off);
      if (kFused) acc1[r] += __shfl_xor_sync(0xFFFFFFFFu, acc1[r], off);
    }
  }
  if (gl == 0 && row < out_rows) {
#pragma unroll
    for (int r = 0; r < kM; ++r) {
      if (r >= rows_used) break;
      out[static_cast<int64_t>(r) * out_rows + row] = kFused ? SiluF(acc0[r]) * acc1[r] : acc0[r];
    }
  }
}

// Copies activation rows into padded shared memory; row r < rows_used comes from src_row(r),
// rows beyond are left unread by MatVecBlock.
template <int kM, typename SrcRow>
__device__ __forceinline__ void LoadActivations(float* xs, int cols, int rows_used, SrcRow src_row) {
  const int quads = cols / 4;
  const int xs_stride = cols / 32 * kPieceStride;
  for (int r = 0; r < kM && r < rows_used; ++r) {
    const float4* src = reinterpret_cast<const float4*>(src_row(r));
    for (int q = threadIdx.x; q < quads; q += kMatVecThreads) {
      const int c = q * 4;
      *reinterpret_cast<float4*>(xs + r * xs_stride + (c / 32) * kPieceStride + c % 32) = src[q];
    }
  }
  __syncthreads();
}

template <uint32_t kType, int kM>
__global__ void __launch_bounds__(kMatVecThreads) DenseMatVecKernel(const uint8_t* w, int cols, int out_rows,
                                                                    const float* x, int n, float* y) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const int t0 = blockIdx.y * kM;
  const int rows_used = min(kM, n - t0);
  LoadActivations<kM>(xs, cols, rows_used, [&](int r) { return x + static_cast<int64_t>(t0 + r) * cols; });
  MatVecBlock<kType, kM, false>(w, nullptr, cols, out_rows, rows_used, xs, y + static_cast<int64_t>(t0) * out_rows);
}

template <uint32_t kType, int kM, bool kFused>
__global__ void __launch_bounds__(kMatVecThreads) ExpertMatVecKernel(const ExpertUnit* units, int cols, int out_rows,
                                                                     const float* in, float* out,
                                                                     const int* device_num_units) {
  if (device_num_units != nullptr && static_cast<int>(blockIdx.y) >= __ldg(device_num_units)) return;
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const ExpertUnit& u = units[blockIdx.y];
  const int rows_used = min(kM, u.rows);
  const int first = u.first_slot;
  if (kFused) {
    LoadActivations<kM>(xs, cols, rows_used, [&](int r) { return in + static_cast<int64_t>(u.input_row[r]) * cols; });
    MatVecBlock<kType, kM, true>(static_cast<const uint8_t*>(u.gate), static_cast<const uint8_t*>(u.up), cols,
                                 out_rows, rows_used, xs, out + static_cast<int64_t>(first) * out_rows);
  } else {
    LoadActivations<kM>(xs, cols, rows_used, [&](int r) { return in + static_cast<int64_t>(first + r) * cols; });
    MatVecBlock<kType, kM, false>(static_cast<const uint8_t*>(u.down), nullptr, cols, out_rows, rows_used, xs,
                                  out + static_cast<int64_t>(first) * out_rows);
  }
}

inline size_t MatVecSharedBytes(int m, int cols) {
  return static_cast<size_t>(m) * (cols / 32) * kPieceStride * sizeof(float);
}

template <typename Kernel>
cudaError_t PrepareSharedMemory(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

template <uint32_t kType, int kM>
cudaError_t LaunchMatVecM(const MatVecArgs& a) {
  const size_t smem = MatVecSharedBytes(kM, a.cols);
  const int groups = 32 / LanesPerRow(a.cols / 32);
  const int rows_per_block = groups * (kMatVecThreads / 32);
  const unsigned gx = static_cast<unsigned>((a.out_rows + rows_per_block - 1) / rows_per_block);
  cudaError_t err;
  if (a.mode == MatVecMode::kDense) {
    auto kernel = DenseMatVecKernel<kType, kM>;
    if ((err = PrepareSharedMemory(kernel, smem)) != cudaSuccess) return err;
    const unsigned gy = static_cast<unsigned>((a.max_rows + kM - 1) / kM);
    kernel<<<dim3(gx, gy), kMatVecThreads, smem, a.stream>>>(static_cast<const uint8_t*>(a.w), a.cols, a.out_rows,
                                                             a.in, a.max_rows, a.out);
  } else if (a.mode == MatVecMode::kGateUp) {
    auto kernel = ExpertMatVecKernel<kType, kM, true>;
    if ((err = PrepareSharedMemory(kernel, smem)) != cudaSuccess) return err;
    kernel<<<dim3(gx, a.num_units), kMatVecThreads, smem, a.stream>>>(a.units, a.cols, a.out_rows, a.in, a.out,
                                                                      a.device_num_units);
  } else {
    auto kernel = ExpertMatVecKernel<kType, kM, false>;
    if ((err = PrepareSharedMemory(kernel, smem)) != cudaSuccess) return err;
    kernel<<<dim3(gx, a.num_units), kMatVecThreads, smem, a.stream>>>(a.units, a.cols, a.out_rows, a.in, a.out,
                                                                      a.device_num_units);
  }
  return cudaGetLastError();
}

// Picks the kernel. Dense launches of Q8_0, Q4_K, Q5_K and Q6_K take the fast kernel of
// ../matvec_core.cuh when one activation row fits its shared memory. Expert units (gate/up, down)
// take the generic kernel: the fast kernel's unit modes measured slower on the decode shapes
// (PERF_NOTES.md, 2026-11-29), so they are not dispatched. Generic row bucket: one row (the
// batch-1 decode shape) or up to kMaxUnitRows.
template <uint32_t kType>
cudaError_t LaunchMatVecTyped(const MatVecArgs& a) {
  using F = typename fastmv::FormatOf<kType>::Type;
  if constexpr (!std::is_void_v<F>) {
    if (a.mode == MatVecMode::kDense && !fastmv::ForceGeneric() &&
        fastmv::SharedBytesFor<F>(1, a.cols) <= fastmv::kMaxFastShared) {
      return fastmv::LaunchFastDense<F>(static_cast<const uint8_t*>(a.w), a.cols, a.out_rows, a.in, a.cols, a.max_rows,
                                        a.out, a.out_rows, a.stream);
    }
  }
  if (a.max_rows <= 1) return LaunchMatVecM<kType, 1>(a);
  return LaunchMatVecM<kType, kMaxUnitRows>(a);
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MATVEC_IMPL_CUH_
