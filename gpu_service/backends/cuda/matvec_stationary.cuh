// The one-activation-row decode matrix-vector kernel with its weights in shared memory: every block
// owns a contiguous range of rows, copies all of their bytes into shared memory with cp.async
// BEFORE its programmatic-dependent-launch wait, and after the wait reads only the activations
// (from L2) while the products come out of shared memory. Q8_0x8 and F32 (the batch-1 decode
// products of the q3n-80b shapes: the mixers' input and output products, the router).
//
// Why (docs/PERF.md, fifteenth session's timeline): a batch-1 product of 4-18 MB is latency-bound
// in the streaming kernel (matvec_stream.cuh): a lane keeps three pieces in flight, so its 9-35
// pieces take several DRAM round trips after the wait, and the ssm_out product (8.9 MB) ended
// 5.7 us after its input was ready against 2 us of bytes. Under PDL a kernel starts while its
// predecessor still runs (pdl.cuh); the weights do not depend on it, so here they are all
// requested at once in that window, when the memory system is otherwise idle (the kernels before
// it are latency-bound), and the wait is followed by one L2 read of x and the arithmetic.
//
// Bits: a row is summed exactly as StreamMatVecKernel<F, 1> sums it at the same warps per row
// (the same lanes take the same pieces in the same order through the same StreamDotPiece, the
// same shuffles, the team's partial sums in member order), so the choice between the two kernels
// is a schedule, never a numerical change (tests/gpu/q8_0x8_test.cc compares their bits).
// One block per SM (up to ~220 KB of rows), so the grid is at most one wave and every block's
// copies start as soon as it is resident. Only .cu files include this header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STATIONARY_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STATIONARY_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/matvec_stream.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda::fastmv {

inline constexpr int kStationaryWarps = 16;
inline constexpr int kStationaryThreads = 32 * kStationaryWarps;
// Dynamic shared memory of one block: its rows, x (swizzled) and the split rows' partial sums.
inline constexpr size_t kStationaryMaxShared = 227 * 1024;

template <class F>
inline constexpr bool kStationaryFormat = std::is_same_v<F, FmtQ8_0x8> || std::is_same_v<F, FmtF32>;

struct StationaryArgs {
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;  // the matrix's row stride (>= the format's natural row length)
  int cols = 0, out_rows = 0;
  const float* x = nullptr;
  float* y = nullptr;
  int wpr = 1;             // warps per row (the streaming kernel's split: same bits)
  int rows_per_block = 1;  // block b owns rows [b·rows_per_block, min(out_rows, (b + 1)·rows_per_block))
};

// Rows, x and partial sums of one block.
template <class F>
inline size_t StationarySharedBytes(int cols, int rows_per_block) {
  return static_cast<size_t>(rows_per_block) * F::RowBytes(cols) + static_cast<size_t>(cols) * sizeof(float) +
         static_cast<size_t>(kStationaryWarps) * 32 * sizeof(float);
}

namespace {  // internal linkage, as in matvec_stream.cuh

// Piece p of a row held in shared memory (F::Load reads global memory through the read-only path).
template <class F>
__device__ __forceinline__ void LoadSharedPiece(const uint8_t* row, int p, typename F::Raw& r) {
  if constexpr (std::is_same_v<F, FmtQ8_0x8>) {
    const uint8_t* sb = row + (p >> 4) * 272;
    r.q = *reinterpret_cast<const uint4*>(sb + 16 + 16 * (p & 15));
    r.d = *reinterpret_cast<const uint16_t*>(sb + 2 * ((p & 15) >> 1));
  } else {
    r.v0 = *reinterpret_cast<const uint4*>(row + 32 * p);
    r.v1 = *reinterpret_cast<const uint4*>(row + 32 * p + 16);
  }
}

template <class F>
__global__ void __launch_bounds__(kStationaryThreads, 1) StationaryMatVecKernel(const StationaryArgs a) {
  static_assert(kStationaryFormat<F>, "Q8_0x8 or F32");
  extern __shared__ __align__(16) uint8_t smem[];
  const int cols = a.cols, quads = cols / 4, pieces = cols / F::kPieceElems;
  const int row_len = static_cast<int>(F::RowBytes(cols));  // a multiple of 16 for both formats
  const int r0 = static_cast<int>(blockIdx.x) * a.rows_per_block;
  const int nrows = min(a.rows_per_block, a.out_rows - r0);
  float4* xs4 = reinterpret_cast<float4*>(smem + static_cast<size_t>(a.rows_per_block) * row_len);
  float* red = reinterpret_cast<float*>(xs4 + quads);

  // Every byte of the block's rows, before the wait: the weights are constant (pdl.cuh's rule
  // allows reading them while the previous kernel runs), so the copies overlap it.
  const int chunks = row_len / 16, total = nrows * chunks;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  for (int c = threadIdx.x; c < total; c += kStationaryThreads) {
    const int r = c / chunks, k = c - r * chunks;
    CpAsync16(base + static_cast<uint32_t>(r * row_len + 16 * k), a.w + static_cast<int64_t>(r0 + r) * a.row_bytes + 16 * k);
  }
  CpAsyncCommit();
  PdlWaitForPrevious();  // x is the previous kernel's output
  PdlAllowNext();
  for (int q = threadIdx.x; q < quads; q += kStationaryThreads) {
    xs4[F::Swz(q)] = __ldg(reinterpret_cast<const float4*>(a.x) + q);
  }
  CpAsyncWait<0>();
  __syncthreads();

  // Rows as StreamMatVecKernel<F, 1> sums them: a team of wpr warps per row (lanes sl of lpr in
  // sub-group `sub`), lane pieces p0, p0 + step, ... in order.
  const int lpr = LanesPerRow<F>(cols), subs = 32 / lpr;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane / lpr, sl = lane & (lpr - 1);
  const int wpr = a.wpr, team = warp / wpr, member = warp - team * wpr;
  const int rows_per_pass = kStationaryWarps / wpr * subs;
  const int p0 = member * lpr + sl, step = lpr * wpr;
  for (int pass = 0; pass < nrows; pass += rows_per_pass) {  // uniform over the block
    const int r = pass + team * subs + sub;
    float acc[1][1] = {{0.0f}};
    if (r < nrows) {
      const uint8_t* row = smem + static_cast<size_t>(r) * row_len;
#pragma unroll 4  // the shared-memory loads of four pieces ahead of their (in-order) sums
      for (int p = p0; p < pieces; p += step) {
        typename F::Raw raw[1];
        LoadSharedPiece<F>(row, p, raw[0]);
        StreamDotPiece<F, 1, 1>(raw, p, xs4, quads, nullptr, 0, acc);
      }
    }
    for (int off = lpr / 2; off > 0; off >>= 1) acc[0][0] += __shfl_xor_sync(0xFFFFFFFFu, acc[0][0], off);
    if (wpr > 1) {  // the team's warps add their partial sums in member order
      if (sl == 0) red[warp * subs + sub] = acc[0][0];
      __syncthreads();
      if (member == 0 && sl == 0) {
        for (int m = 1; m < wpr; ++m) acc[0][0] += red[(warp + m) * subs + sub];
      }
      __syncthreads();
    }
    if (member == 0 && sl == 0 && r < nrows) a.y[r0 + r] = acc[0][0];
  }
}

}  // namespace

// Rows per block of a stationary launch over `rows` rows (one block per SM, rows spread evenly),
// or 0 when a block's rows do not fit kStationaryMaxShared.
// TANDEM_MATVEC_STATIONARY_MAX_KB (read once; 1..227, default 227) lowers that bound: an A/B knob
// for which products take the kernel (a block of the q3n-80b router's holds 32 KB of rows, of the
// output product and z 67 KB, of the stacked GDN inputs 136 KB).
template <class F>
inline int StationaryRowsPerBlock(int cols, int rows) {
  if (!kStationaryFormat<F> || rows <= 0) return 0;
  static const size_t limit = static_cast<size_t>(EnvInteger("TANDEM_MATVEC_STATIONARY_MAX_KB", 227, 1, 227)) * 1024;
  const int sms = DeviceSmCount();
  const int per_block = (rows + sms - 1) / sms;
  return StationarySharedBytes<F>(cols, per_block) <= limit ? per_block : 0;
}

// y = W·x for one activation row (StreamTakes<F> must hold), each row summed as the streaming
// kernel sums it at `wpr` warps per row (1, 2, 4 or 8). cudaErrorInvalidValue when
// StationaryRowsPerBlock is 0.
template <class F>
cudaError_t LaunchStationary(const uint8_t* w, int64_t row_bytes, int cols, int rows, const float* x, float* y, int wpr,
                             cudaStream_t stream) {
  if constexpr (!kStationaryFormat<F>) {
    return cudaErrorInvalidValue;
  } else {
    const int per_block = StationaryRowsPerBlock<F>(cols, rows);
    if (per_block <= 0 || (wpr != 1 && wpr != 2 && wpr != 4 && wpr != 8)) return cudaErrorInvalidValue;
    auto kernel = StationaryMatVecKernel<F>;
    static const cudaError_t attr =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStationaryMaxShared));
    if (attr != cudaSuccess) return attr;
    StationaryArgs a;
    a.w = w;
    a.row_bytes = row_bytes;
    a.cols = cols;
    a.out_rows = rows;
    a.x = x;
    a.y = y;
    a.wpr = wpr;
    a.rows_per_block = per_block;
    const unsigned blocks = static_cast<unsigned>((rows + per_block - 1) / per_block);
    return LaunchPdl(kernel, dim3(blocks), kStationaryThreads, StationarySharedBytes<F>(cols, per_block), stream, a);
  }
}

}  // namespace tandem::cuda::fastmv

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STATIONARY_CUH_
