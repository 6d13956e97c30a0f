// The int8 MMA one-row product (matvec_int8_mma.cuh says what and why). A block of eight warps
// takes 16-row tiles (block b: tiles b, b + grid, ...); warp w takes the 128-column chunks w, w + 8
// of every tile, so a tile's 16 rows are read at once by the whole block, and its eight partial
// sums a row meet in shared memory in warp order. The next tile's loads go out before the current
// one's MMAs; the first tile's before the PDL wait (weights only).
#include "gpu_service/backends/cuda/kernels/matvec_int8_mma.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/norm_row.cuh"
#include "gpu_service/backends/cuda/matvec_stream.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kTileRows = 16;
constexpr int kChunkCols = 128;  // four Q8_0 blocks: one lane's two 16-byte loads a row
constexpr int kMaxCols = kMmaWarps * kChunkCols * 2;
constexpr float kLoSteps = 254.0f;  // x ≈ s·(hi + lo / kLoSteps), |lo| <= 127

struct Int8MmaArgs {
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
  int cols = 0, rows = 0;
  const float* x = nullptr;  // the plain form's activation row
  float* y = nullptr;
  fastmv::StreamNormIn norm;  // the norm-in form's input
};

// Shared memory: x (cols floats), max|x| per 32 columns, the warps' partial sums of two tiles,
// then (norm-in) the norm's area of four rows.
__host__ __device__ inline size_t AmaxOffset(int cols) { return static_cast<size_t>(cols) * 4; }
__host__ __device__ inline size_t RedOffset(int cols) { return AmaxOffset(cols) + static_cast<size_t>(cols) / 32 * 4; }
__host__ __device__ inline size_t NormAreaOffset(int cols) {
  return (RedOffset(cols) + 2 * kMmaWarps * kTileRows * 4 + 15) / 16 * 16;
}
inline size_t SharedBytes(int cols, bool norm_in) {
  return norm_in ? NormAreaOffset(cols) + 4 * static_cast<size_t>(cols) * 4 : RedOffset(cols) + 2 * kMmaWarps * kTileRows * 4;
}

// x unswizzled (fastmv::NormInStage writes xs4[Swz(i)]).
struct PlainOrder {
  __device__ static int Swz(int q) { return q; }
};

// d += a · b, int8 operands, int32 accumulators (m16n8k32).
__device__ __forceinline__ void MmaS8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                      uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 LdWeights16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint32_t LdWeights4(const uint8_t* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }

// One lane's share of a tile: rows g and g + 8 of its chunks (lo: columns 16t.., hi: 64 + 16t..),
// and the f16 weight scales of its two blocks in each.
template <int kCpw>
struct TileRegs {
  uint4 lo0[kCpw], hi0[kCpw], lo1[kCpw], hi1[kCpw];
  uint32_t s0[kCpw], s1[kCpw];
};

template <int kCpw>
__device__ __forceinline__ void LoadTile(const Int8MmaArgs& a, int tile, int warp, int chunks, int g, int t,
                                         TileRegs<kCpw>& r) {
  const int64_t r0 = min(tile * kTileRows + g, a.rows - 1), r1 = min(tile * kTileRows + g + 8, a.rows - 1);
  const uint8_t* row0 = a.w + r0 * a.row_bytes;
  const uint8_t* row1 = a.w + r1 * a.row_bytes;
#pragma unroll
  for (int j = 0; j < kCpw; ++j) {
    const int c = warp + kMmaWarps * j;
    if (c < chunks) {
      const int sb = (c >> 1) * static_cast<int>(kQ8_0x8SuperBytes), h = c & 1;
      const int q = sb + 16 + 128 * h + 16 * t, s = sb + 8 * h + 4 * (t & 1);
      r.lo0[j] = LdWeights16(row0 + q);
      r.hi0[j] = LdWeights16(row0 + q + 64);
      r.lo1[j] = LdWeights16(row1 + q);
      r.hi1[j] = LdWeights16(row1 + q + 64);
      r.s0[j] = LdWeights4(row0 + s);
      r.s1[j] = LdWeights4(row1 + s);
    }
  }
}

// acc0 / acc1 (rows g, g + 8) += this lane's two blocks of each of its chunks, scaled.
template <int kCpw>
__device__ __forceinline__ void TileMma(const TileRegs<kCpw>& r, const uint32_t (&b)[kCpw][8],
                                        const float (&sx)[kCpw][2], int warp, int chunks, float& acc0, float& acc1) {
#pragma unroll
  for (int j = 0; j < kCpw; ++j) {
    if (warp + kMmaWarps * j < chunks) {
      int d[4] = {0, 0, 0, 0};
      MmaS8(d, r.lo0[j].x, r.lo1[j].x, r.lo0[j].y, r.lo1[j].y, b[j][0], b[j][1]);
      MmaS8(d, r.lo0[j].z, r.lo1[j].z, r.lo0[j].w, r.lo1[j].w, b[j][2], b[j][3]);
      MmaS8(d, r.hi0[j].x, r.hi1[j].x, r.hi0[j].y, r.hi1[j].y, b[j][4], b[j][5]);
      MmaS8(d, r.hi0[j].z, r.hi1[j].z, r.hi0[j].w, r.hi1[j].w, b[j][6], b[j][7]);
      const float2 w0 = __half22float2(*reinterpret_cast<const __half2*>(&r.s0[j]));
      const float2 w1 = __half22float2(*reinterpret_cast<const __half2*>(&r.s1[j]));
      acc0 = fmaf(w0.x * sx[j][0], static_cast<float>(d[0]), acc0);
      acc0 = fmaf(w0.y * sx[j][1], static_cast<float>(d[1]), acc0);
      acc1 = fmaf(w1.x * sx[j][0], static_cast<float>(d[2]), acc1);
      acc1 = fmaf(w1.y * sx[j][1], static_cast<float>(d[3]), acc1);
    }
  }
}

// Four int8 values packed into one word (little end first).
__device__ __forceinline__ uint32_t Pack4(int a, int b, int c, int d) {
  return (static_cast<uint32_t>(a) & 0xFFu) | ((static_cast<uint32_t>(b) & 0xFFu) << 8) |
         ((static_cast<uint32_t>(c) & 0xFFu) << 16) | (static_cast<uint32_t>(d) << 24);
}

// The lane's B operands of its chunks (b[j][0..3]: the two lo-half MMAs, b[j][4..7]: the hi-half
// ones; zeros where its column's block is not the k-slots') and its two C columns' activation scales.
template <int kCpw>
__device__ __forceinline__ void BuildActivations(const float* xs, const float* amax, int warp, int chunks, int g,
                                                 int t, uint32_t (&b)[kCpw][8], float (&sx)[kCpw][2]) {
  const int n = g, blk = n & 3, term = n >> 2;
  const bool hi_half = blk >= 2;
  const bool mine = (t >> 1) == (blk & 1);
#pragma unroll
  for (int j = 0; j < kCpw; ++j) {
    const int c = warp + kMmaWarps * j;
#pragma unroll
    for (int i = 0; i < 8; ++i) b[j][i] = 0u;
    sx[j][0] = sx[j][1] = 0.0f;
    if (c >= chunks) continue;
    if (mine) {
      const int col = c * kChunkCols + (hi_half ? 64 : 0) + 16 * t;
      const float m = amax[col / 32];
      const float inv = m > 0.0f ? 127.0f / m : 0.0f;
      uint32_t words[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        int q[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float v = xs[col + 4 * k + e] * inv;
          const float hi = fminf(fmaxf(rintf(v), -127.0f), 127.0f);
          q[e] = term == 0 ? static_cast<int>(hi)
                           : static_cast<int>(fminf(fmaxf(rintf((v - hi) * kLoSteps), -127.0f), 127.0f));
        }
        words[k] = Pack4(q[0], q[1], q[2], q[3]);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (hi_half) {
          b[j][4 + k] = words[k];
        } else {
          b[j][k] = words[k];
        }
      }
    }
    // C columns 2t, 2t + 1: term t / 2 of blocks 2(t & 1), 2(t & 1) + 1 of the chunk.
    const int b0 = c * (kChunkCols / 32) + 2 * (t & 1);
    const float f = (t >> 1) ? 1.0f / (127.0f * kLoSteps) : 1.0f / 127.0f;
    sx[j][0] = amax[b0] * f;
    sx[j][1] = amax[b0 + 1] * f;
  }
}

template <int kCpw, bool kNormIn>
__global__ void __launch_bounds__(kMmaThreads, 2) Int8MmaMatVecKernel(const Int8MmaArgs a) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  unsigned char* base = reinterpret_cast<unsigned char*>(smem4);
  float* amax = reinterpret_cast<float*>(base + AmaxOffset(a.cols));
  float* red = reinterpret_cast<float*>(base + RedOffset(a.cols));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int chunks = a.cols / kChunkCols;
  const int tiles = (a.rows + kTileRows - 1) / kTileRows;

  int tile = blockIdx.x;
  TileRegs<kCpw> buf0, buf1;
  if (tile < tiles) LoadTile<kCpw>(a, tile, warp, chunks, g, t, buf0);
  [[maybe_unused]] float4* norm_area = reinterpret_cast<float4*>(base + NormAreaOffset(a.cols));
  if constexpr (kNormIn) fastmv::NormInEarlyCopies(a.norm, a.cols, norm_area);
  PdlWaitForPrevious();  // weights only so far
  PdlAllowNext();

  if constexpr (kNormIn) {
    fastmv::NormInStage<PlainOrder>(a.norm, a.cols, norm_area, smem4);
  } else {
    for (int i = threadIdx.x; i < a.cols / 4; i += kMmaThreads) {
      smem4[i] = __ldg(reinterpret_cast<const float4*>(a.x) + i);
    }
  }
  __syncthreads();
  for (int blk = warp; blk < a.cols / 32; blk += kMmaWarps) {
    float m = fabsf(xs[blk * 32 + lane]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    if (lane == 0) amax[blk] = m;
  }
  __syncthreads();
  uint32_t b[kCpw][8];
  float sx[kCpw][2];
  BuildActivations<kCpw>(xs, amax, warp, chunks, g, t, b, sx);

  // One tile: its MMAs, the lanes' sums over t, the warps' in warp order (red[parity]: a buffer is
  // written again two tiles later, after a barrier its reader has passed).
  int parity = 0;
  auto finish = [&](const TileRegs<kCpw>& cur, int done) {
    float acc0 = 0.0f, acc1 = 0.0f;
    TileMma<kCpw>(cur, b, sx, warp, chunks, acc0, acc1);
    acc0 += __shfl_xor_sync(0xFFFFFFFFu, acc0, 1);
    acc1 += __shfl_xor_sync(0xFFFFFFFFu, acc1, 1);
    acc0 += __shfl_xor_sync(0xFFFFFFFFu, acc0, 2);
    acc1 += __shfl_xor_sync(0xFFFFFFFFu, acc1, 2);
    float* r = red + parity * kMmaWarps * kTileRows;
    if (t == 0) {
      r[warp * kTileRows + g] = acc0;
      r[warp * kTileRows + g + 8] = acc1;
    }
    __syncthreads();
    if (threadIdx.x < kTileRows) {
      const int row = done * kTileRows + static_cast<int>(threadIdx.x);
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) s += r[w * kTileRows + threadIdx.x];
      if (row < a.rows) a.y[row] = s;
    }
    parity ^= 1;
  };
  while (tile < tiles) {
    int next = tile + static_cast<int>(gridDim.x);
    if (next < tiles) LoadTile<kCpw>(a, next, warp, chunks, g, t, buf1);
    finish(buf0, tile);
    tile = next;
    if (tile >= tiles) break;
    next = tile + static_cast<int>(gridDim.x);
    if (next < tiles) LoadTile<kCpw>(a, next, warp, chunks, g, t, buf0);
    finish(buf1, tile);
    tile = next;
  }
}

template <int kCpw, bool kNormIn>
cudaError_t Launch(const Int8MmaArgs& a, cudaStream_t stream) {
  auto kernel = Int8MmaMatVecKernel<kCpw, kNormIn>;
  const size_t smem = SharedBytes(a.cols, kNormIn);
  static const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(SharedBytes(kMaxCols, kNormIn)));
  if (attr != cudaSuccess) return attr;
  int per_sm = 0;
  const cudaError_t occ = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kMmaThreads, smem);
  if (occ != cudaSuccess) return occ;
  const int tiles = (a.rows + kTileRows - 1) / kTileRows;
  const int capacity = std::max(1, per_sm) * fastmv::DeviceSmCount();
  // As few blocks as give the busiest block the fewest tiles (one wave).
  const int rounds = (tiles + capacity - 1) / capacity;
  const int blocks = (tiles + rounds - 1) / rounds;
  return LaunchPdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kMmaThreads), smem, stream, a);
}

template <bool kNormIn>
cudaError_t LaunchForCols(const Int8MmaArgs& a, cudaStream_t stream) {
  const int chunks = a.cols / kChunkCols;
  return chunks <= kMmaWarps ? Launch<1, kNormIn>(a, stream) : Launch<2, kNormIn>(a, stream);
}

Int8MmaArgs ArgsFor(const DeviceMatrix& w, float* y) {
  Int8MmaArgs a;
  a.w = static_cast<const uint8_t*>(w.data);
  a.row_bytes = w.row_bytes;
  a.cols = static_cast<int>(w.cols);
  a.rows = static_cast<int>(w.rows);
  a.y = y;
  return a;
}

std::atomic<bool>& DenseInt8MmaSwitch() {
  static std::atomic<bool> on{EnvSwitchDefaultOn("TANDEM_DENSE_INT8_MMA")};
  return on;
}

}  // namespace

bool DenseInt8Mma() { return DenseInt8MmaSwitch().load(std::memory_order_relaxed); }
void SetDenseInt8Mma(bool on) { DenseInt8MmaSwitch().store(on, std::memory_order_relaxed); }

bool Int8MmaMatVecTakes(const DeviceMatrix& w) {
  return Q8_0x8RowsAligned(w) && w.cols <= kMaxCols && w.rows > 0 && w.rows < (int64_t{1} << 30);
}

cudaError_t LaunchInt8MmaMatVec(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream) {
  if (!Int8MmaMatVecTakes(w) || x == nullptr || y == nullptr || reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  Int8MmaArgs a = ArgsFor(w, y);
  a.x = x;
  return LaunchForCols<false>(a, stream);
}

bool Int8MmaMatVecNormInTakes(const DeviceMatrix& w) {
  return Int8MmaMatVecTakes(w) && norm_row::RegSplitFor(w.cols / 4).vec > 0 &&
         norm_row::RegSplitFor(w.cols / 4).threads <= kMmaThreads;
}

cudaError_t LaunchInt8MmaMatVecNormIn(const DeviceMatrix& w, const MatVecNormIn& in, float* y, cudaStream_t stream) {
  if (!Int8MmaMatVecNormInTakes(w) || in.H == nullptr || in.gamma == nullptr || y == nullptr ||
      (in.sh.shared != nullptr && in.y == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const norm_row::RegSplit split = norm_row::RegSplitFor(w.cols / 4);
  Int8MmaArgs a = ArgsFor(w, y);
  a.norm.H = in.H;
  a.norm.y = in.y;
  a.norm.shared = in.sh.shared;
  a.norm.gate_logit = in.sh.gate_logit;
  a.norm.gamma = in.gamma;
  a.norm.eps = in.eps;
  a.norm.vec = split.vec;
  a.norm.threads = split.threads;
  a.norm.h_early = in.h_written_earlier && !OldNormEarlyH();  // as LaunchDenseMatVecNormIn
  return LaunchForCols<true>(a, stream);
}

}  // namespace tandem::cuda
