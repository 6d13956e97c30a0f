// The column-split one-row product (dense_colsplit.cuh). Block (s, c), 256 threads: super-block s of
// every row in slice c (rows_per_block rows of 272 bytes: eight f16 scales, then 8 × 32 int8
// quants; device_matrix.h) copied into shared memory with 16-byte cp.async before the PDL wait;
// thread t then quantizes x[256s + t] (warp w: Q8_0 block w of the super-block, one int16 scale)
// and sums rows t, t + 256, ...: eight blocks of 32 a row, each a dp2a chain (int8 × int16, exact
// in int32) times its weight scale and x's scale.
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSuperCols = 256;
constexpr int kSuperBytes = static_cast<int>(kQ8_0x8SuperBytes);
constexpr int kPieces = kSuperBytes / 16;
constexpr int kMaxRowsPerBlock = 640;  // 170 KB of shared memory
constexpr int kTargetBlocks = 128;     // about one block an SM of an H200

size_t SharedBytes(int rows_per_block) {
  return static_cast<size_t>(rows_per_block) * kSuperBytes + kSuperCols * sizeof(int16_t) + 8 * sizeof(float);
}

// Row slices: the count nearest kTargetBlocks / supers that divides rows and keeps a slice within
// kMaxRowsPerBlock (0 when none does).
int RowSlices(int64_t rows, int64_t supers) {
  const int64_t want = std::max<int64_t>(1, kTargetBlocks / supers);
  for (int64_t d = 0; d <= want; ++d) {
    for (const int64_t s : {want - d, want + d}) {
      if (s >= 1 && rows % s == 0 && rows / s <= kMaxRowsPerBlock) return static_cast<int>(s);
    }
  }
  return 0;
}

__device__ __forceinline__ int Dot16(uint4 qv, uint4 x0, uint4 x1, int s) {
  s = __dp2a_lo(static_cast<int>(x0.x), static_cast<int>(qv.x), s);
  s = __dp2a_hi(static_cast<int>(x0.y), static_cast<int>(qv.x), s);
  s = __dp2a_lo(static_cast<int>(x0.z), static_cast<int>(qv.y), s);
  s = __dp2a_hi(static_cast<int>(x0.w), static_cast<int>(qv.y), s);
  s = __dp2a_lo(static_cast<int>(x1.x), static_cast<int>(qv.z), s);
  s = __dp2a_hi(static_cast<int>(x1.y), static_cast<int>(qv.z), s);
  s = __dp2a_lo(static_cast<int>(x1.z), static_cast<int>(qv.w), s);
  s = __dp2a_hi(static_cast<int>(x1.w), static_cast<int>(qv.w), s);
  return s;
}

__global__ void __launch_bounds__(kThreads)
ColumnSplitKernel(const uint8_t* __restrict__ w, int64_t row_bytes, int rows_per_block, const float* __restrict__ x,
                  float* __restrict__ y) {
  extern __shared__ __align__(16) uint8_t sh[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int super = blockIdx.x, row0 = blockIdx.y * rows_per_block;
  // The weights first (constants: before the wait, overlapping the kernels before).
  const uint8_t* src = w + static_cast<int64_t>(row0) * row_bytes + static_cast<int64_t>(super) * kSuperBytes;
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(sh));
  for (int i = tid; i < rows_per_block * kPieces; i += kThreads) {
    const int row = i / kPieces, piece = i - row * kPieces;
    CpAsync16(dst + row * kSuperBytes + piece * 16, src + row * row_bytes + piece * 16);
  }
  CpAsyncCommit();
  PdlWaitForPrevious();  // pdl.cuh
  PdlAllowNext();
  int16_t* xq = reinterpret_cast<int16_t*>(sh + static_cast<size_t>(rows_per_block) * kSuperBytes);
  float* xscale = reinterpret_cast<float*>(xq + kSuperCols);
  const float xv = x[static_cast<int64_t>(super) * kSuperCols + tid];
  float m = fabsf(xv);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  const float inv = m > 0.0f ? 32767.0f / m : 0.0f;
  xq[tid] = static_cast<int16_t>(__float2int_rn(xv * inv));
  if (lane == 0) xscale[warp] = m * (1.0f / 32767.0f);
  CpAsyncWait<0>();
  __syncthreads();
  const uint4* xw = reinterpret_cast<const uint4*>(xq);
  for (int row = tid; row < rows_per_block; row += kThreads) {
    const uint8_t* sb = sh + static_cast<size_t>(row) * kSuperBytes;
    const uint4 d4 = *reinterpret_cast<const uint4*>(sb);
    const uint32_t dw[4] = {d4.x, d4.y, d4.z, d4.w};
    float acc = 0.0f;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      const uint4* q = reinterpret_cast<const uint4*>(sb + 16 + 32 * b);
      int s = Dot16(q[0], xw[4 * b], xw[4 * b + 1], 0);
      s = Dot16(q[1], xw[4 * b + 2], xw[4 * b + 3], s);
      const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(dw[b / 2] >> (16 * (b & 1)))));
      acc = fmaf(static_cast<float>(s), d * xscale[b], acc);
    }
    atomicAdd(y + row0 + row, acc);
  }
}

std::atomic<bool>& AttnOutColumnSplitSwitch() {
  static std::atomic<bool> on{EnvSwitchDefaultOn("TANDEM_ATTN_OUT_COLSPLIT")};
  return on;
}

}  // namespace

bool ColumnSplitMatVecFits(const DeviceMatrix& w) {
  if (w.type != kTypeQ8_0x8 || w.data == nullptr || w.cols <= 0 || w.cols % kSuperCols != 0 || w.rows <= 0) {
    return false;
  }
  if (reinterpret_cast<uintptr_t>(w.data) % 16 != 0 || w.row_bytes % 16 != 0 || w.row_bytes < Q8_0x8RowBytes(w.cols)) {
    return false;
  }
  return w.cols / kSuperCols <= 65535 && RowSlices(w.rows, w.cols / kSuperCols) > 0;
}

cudaError_t LaunchColumnSplitMatVec(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream) {
  if (!ColumnSplitMatVecFits(w)) return cudaErrorNotSupported;
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  static const cudaError_t attr = cudaFuncSetAttribute(
      ColumnSplitKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(SharedBytes(kMaxRowsPerBlock)));
  if (attr != cudaSuccess) return attr;
  const int64_t supers = w.cols / kSuperCols;
  const int slices = RowSlices(w.rows, supers);
  const int rpb = static_cast<int>(w.rows / slices);
  return LaunchPdl(ColumnSplitKernel, dim3(static_cast<unsigned>(supers), static_cast<unsigned>(slices)), kThreads,
                   SharedBytes(rpb), stream, static_cast<const uint8_t*>(w.data), w.row_bytes, rpb, x, y);
}

bool AttnOutColumnSplit() { return AttnOutColumnSplitSwitch().load(std::memory_order_relaxed); }
void SetAttnOutColumnSplit(bool on) { AttnOutColumnSplitSwitch().store(on, std::memory_order_relaxed); }

}  // namespace tandem::cuda
