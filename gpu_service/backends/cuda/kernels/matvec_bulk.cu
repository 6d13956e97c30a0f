// The bulk-copy Q8_0x8 matrix-vector product (matvec_bulk.cuh).
//
// Layout of the work: the matrix's rows in chunks of kChunkRows (the last may be short); block b
// takes chunks [b·C/G, (b+1)·C/G) of the C chunks over G blocks (one an SM), a contiguous run of
// bytes. Its ring holds kStages chunks; thread 0 fills a stage with bulk copies of at most
// kCopyPiece bytes completing the stage's mbarrier, the first kStages before the PDL wait. Warp w
// sums rows w and w + kWarps of each chunk. In a row, lane l takes the 16-byte quant chunks
// l, l + 32, ... (16 columns each: super-block c / 16, its chunk c % 16, whose f16 scale is the
// super-block's (c % 16) / 2-th), so that each quarter warp reads 128 contiguous bytes of shared
// memory, and holds those columns of x in registers; the row's sum is the lanes' scaled sums added
// by a butterfly. Every row's bits depend only on the row and x (not on the chunking or the grid).
#include "gpu_service/backends/cuda/kernels/matvec_bulk.cuh"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/matvec_formats.cuh"
#include "gpu_service/backends/cuda/mbarrier.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kChunkRows = 2 * kWarps;  // two rows a warp a chunk
constexpr int kStages = 4;              // 4 × 16 rows × 2176 bytes = 139 KB at 2048 columns
constexpr uint32_t kCopyPiece = 16384;  // bytes a bulk copy
constexpr int kSuperBytes = 272;        // Q8_0x8: eight f16 scales, then 256 int8 quants
constexpr int kMaxColumns = 2048;

int64_t RowBytes(int64_t cols) { return cols / 256 * kSuperBytes; }
size_t SharedBytes(int64_t cols) { return static_cast<size_t>(kStages) * kChunkRows * RowBytes(cols); }

// kPerLane = cols / 512: the 16-byte quant chunks of a row each lane takes.
template <int kPerLane>
__global__ void __launch_bounds__(kThreads, 1)
BulkMatVecKernel(const uint8_t* __restrict__ w, int rows, int chunks, bool spread, const float* __restrict__ x,
                 float* __restrict__ y) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ __align__(8) uint64_t full[kStages];
  constexpr int kCols = kPerLane * 512;
  constexpr int kRowBytes = kCols / 256 * kSuperBytes;
  constexpr int kStageBytes = kChunkRows * kRowBytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // The block's chunks: a contiguous run of them, or (spread) every gridDim.x-th from its index, so
  // that the grid's reads sweep the matrix front to back together.
  const int first = static_cast<int>(static_cast<int64_t>(blockIdx.x) * chunks / gridDim.x);
  const int count = spread ? (chunks - static_cast<int>(blockIdx.x) + gridDim.x - 1) / gridDim.x
                           : static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * chunks / gridDim.x) - first;
  auto chunk_of = [&](int i) { return spread ? static_cast<int>(blockIdx.x + i * gridDim.x) : first + i; };
  const uint32_t ring_addr = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  const uint32_t full_addr = static_cast<uint32_t>(__cvta_generic_to_shared(full));
  // The block's i-th chunk into stage i % kStages: its rows' bytes (the matrix's last chunk may be
  // short).
  auto issue = [&](int i) {
    const int c = chunk_of(i), s = i % kStages;
    const int chunk_rows = min(kChunkRows, rows - c * kChunkRows);
    const uint32_t bytes = static_cast<uint32_t>(chunk_rows) * kRowBytes;
    const uint32_t bar = full_addr + 8u * s;
    const uint8_t* src = w + static_cast<int64_t>(c) * kStageBytes;
    mbarrier::ArriveExpectTx(bar, bytes);
    for (uint32_t off = 0; off < bytes; off += kCopyPiece) {
      mbarrier::BulkCopyToShared(ring_addr + s * kStageBytes + off, src + off, min(kCopyPiece, bytes - off), bar);
    }
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier::Init(full_addr + 8u * s, 1);
    mbarrier::InitFence();
    // The weights are constants: their copies go out before the wait (pdl.cuh), overlapping the
    // kernels before.
    for (int i = 0; i < min(count, kStages); ++i) issue(i);
  }
  __syncthreads();  // the barriers' init is visible to every thread
  PdlWaitForPrevious();  // x
  PdlAllowNext();
  // This lane's columns of x: chunk l + 32k holds columns 256·sb + 16·cw .. + 15 (sb = its
  // super-block, cw = its chunk in it).
  float4 xr[kPerLane][4];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + 32 * k, sb = c >> 4, cw = c & 15;
    const float4* src = reinterpret_cast<const float4*>(x + sb * 256 + cw * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) xr[k][i] = src[i];
  }
  for (int i = 0; i < count; ++i) {
    const int c = chunk_of(i), s = i % kStages;
    mbarrier::WaitParity(full_addr + 8u * s, static_cast<uint32_t>((i / kStages) & 1));
    const int chunk_rows = min(kChunkRows, rows - c * kChunkRows);
    const uint8_t* stage = ring + s * kStageBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp + h * kWarps;
      if (r >= chunk_rows) break;  // warp-uniform
      const uint8_t* row = stage + r * kRowBytes;
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int cc = lane + 32 * k, sb = cc >> 4, cw = cc & 15;
        const uint8_t* sbp = row + sb * kSuperBytes;
        const uint4 q = *reinterpret_cast<const uint4*>(sbp + 16 + 16 * cw);
        const float d = fastmv::F16Bits(*reinterpret_cast<const uint16_t*>(sbp + 2 * (cw >> 1)));
        float part = 0.0f;
        part = fastmv::FmaQuad(fastmv::BytesToFloat4<128>(q.x ^ 0x80808080u), xr[k][0], part);
        part = fastmv::FmaQuad(fastmv::BytesToFloat4<128>(q.y ^ 0x80808080u), xr[k][1], part);
        part = fastmv::FmaQuad(fastmv::BytesToFloat4<128>(q.z ^ 0x80808080u), xr[k][2], part);
        part = fastmv::FmaQuad(fastmv::BytesToFloat4<128>(q.w ^ 0x80808080u), xr[k][3], part);
        sum = fmaf(d, part, sum);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
      if (lane == 0) y[c * kChunkRows + r] = sum;
    }
    __syncthreads();  // every warp is done with stage s: it takes the block's chunk i + kStages
    if (threadIdx.x == 0 && i + kStages < count) issue(i + kStages);
  }
}

int SmCount() {
  static const int count = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      return 132;
    }
    return v;
  }();
  return count;
}

// TANDEM_MATVEC_BULK_SPREAD=1: blocks take every gridDim.x-th chunk instead of a contiguous run (an
// A/B of the DRAM access order).
bool MatVecBulkSpread() {
  static const bool on = EnvSwitch("TANDEM_MATVEC_BULK_SPREAD");
  return on;
}

template <int kPerLane>
cudaError_t Launch(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream) {
  const size_t smem = SharedBytes(kPerLane * 512);
  // Above 48 KiB a kernel needs the opt-in: once per instantiation (thread-safe static).
  static const cudaError_t attribute =
      cudaFuncSetAttribute(BulkMatVecKernel<kPerLane>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attribute != cudaSuccess) return attribute;
  const int rows = static_cast<int>(w.rows);
  const int chunks = (rows + kChunkRows - 1) / kChunkRows;
  const int blocks = std::min(SmCount(), chunks);
  return LaunchPdl(BulkMatVecKernel<kPerLane>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), smem, stream,
                   static_cast<const uint8_t*>(w.data), rows, chunks, MatVecBulkSpread(), x, y);
}

std::atomic<bool>& MatVecBulkSwitch() {
  static std::atomic<bool> on{EnvSwitch("TANDEM_MATVEC_BULK")};
  return on;
}

}  // namespace

bool BulkMatVecTakes(const DeviceMatrix& w, int n) {
  return n == 1 && w.type == kTypeQ8_0x8 && w.data != nullptr && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
         w.cols >= 512 && w.cols <= kMaxColumns && w.cols % 512 == 0 && w.row_bytes == RowBytes(w.cols) &&
         w.rows >= 1 && w.rows < (int64_t{1} << 30);
}

cudaError_t LaunchBulkMatVec(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream) {
  if (!BulkMatVecTakes(w, 1) || x == nullptr || y == nullptr || reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  switch (w.cols / 512) {
    case 1:
      return Launch<1>(w, x, y, stream);
    case 2:
      return Launch<2>(w, x, y, stream);
    case 3:
      return Launch<3>(w, x, y, stream);
    default:
      return Launch<4>(w, x, y, stream);
  }
}

bool MatVecBulk() { return MatVecBulkSwitch().load(std::memory_order_relaxed); }
void SetMatVecBulk(bool on) { MatVecBulkSwitch().store(on, std::memory_order_relaxed); }

}  // namespace tandem::cuda
