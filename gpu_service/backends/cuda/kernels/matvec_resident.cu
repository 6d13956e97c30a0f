// The resident int8 MMA one-row product (matvec_resident.cuh says what and why). One block of
// eight warps an SM takes a contiguous run of 16-row tiles; warp 0 asks for every row of the run
// with one bulk copy a row (each tile completing its own mbarrier) before the PDL wait, rows 64
// bytes apart beyond their length so that the lanes' 16-byte reads of rows g and g + 1 fall in
// different banks. After the wait x is formed (read, or normed from H, y and the shared term in
// registers), quantized into each lane's B operands, and every tile is multiplied as it lands:
// warp w takes the 128-column chunks w and w + 8, its partial sums of a row meet the other warps'
// in shared memory in warp order.
#include "gpu_service/backends/cuda/kernels/matvec_resident.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/norm_row.cuh"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/matvec_stream_norm_in.cuh"
#include "gpu_service/backends/cuda/mbarrier.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/smem_limit.h"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileRows = 16;
constexpr int kChunkCols = 128;  // four Q8_0 blocks: one lane's two 16-byte reads of a row
constexpr int kCpw = 2;          // chunks a warp: w and w + 8
constexpr int kMaxCols = kWarps * kChunkCols * kCpw;
constexpr int kRowPad = 64;         // shared-memory bytes after each row (bank spread)
constexpr float kLoSteps = 254.0f;  // x ≈ s·(hi + lo / kLoSteps), |lo| <= 127

struct ResidentArgs {
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
  int cols = 0, rows = 0;
  int tiles_per_block = 0;
  const float* x = nullptr;  // the plain form's activation row
  float* y = nullptr;
  fastmv::StreamNormIn norm;  // the norm-in form's input (its vec <= 4)
};

// Shared memory: the run's tiles (tiles · 16 rows of RowStride bytes), x (cols floats), max|x| per
// 32 columns, the warps' partial sums of two tiles, one mbarrier a tile.
__host__ __device__ inline int RowStride(int cols) { return static_cast<int>(Q8_0x8RowBytes(cols)) + kRowPad; }
__host__ __device__ inline size_t XOffset(int cols, int tiles) {
  return static_cast<size_t>(tiles) * kTileRows * RowStride(cols);
}
__host__ __device__ inline size_t AmaxOffset(int cols, int tiles) { return XOffset(cols, tiles) + size_t(cols) * 4; }
__host__ __device__ inline size_t RedOffset(int cols, int tiles) { return AmaxOffset(cols, tiles) + size_t(cols) / 8; }
__host__ __device__ inline size_t BarOffset(int cols, int tiles) {
  return RedOffset(cols, tiles) + 2 * kWarps * kTileRows * 4;
}
inline size_t SharedBytes(int cols, int tiles) { return BarOffset(cols, tiles) + static_cast<size_t>(tiles) * 8; }

// d += a · b, int8 operands, int32 accumulators (m16n8k32).
__device__ __forceinline__ void MmaS8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                      uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four int8 values packed into one word (the first in the low byte).
__device__ __forceinline__ uint32_t Pack4(int a, int b, int c, int d) {
  return (static_cast<uint32_t>(a) & 0xFFu) | ((static_cast<uint32_t>(b) & 0xFFu) << 8) |
         ((static_cast<uint32_t>(c) & 0xFFu) << 16) | (static_cast<uint32_t>(d) << 24);
}

// The lane's B operands of its chunks (b[j][0..3]: the two MMAs over its lo 16 bytes, b[j][4..7]:
// over its hi 16 bytes; zeros where its column's block is not theirs) and its two C columns'
// activation scales.
__device__ __forceinline__ void BuildActivations(const float* xs, const float* amax, int warp, int chunks, int g,
                                                 int t, uint32_t (&b)[kCpw][8], float (&sx)[kCpw][2]) {
  const int blk = g & 3, term = g >> 2;
  const bool hi_half = blk >= 2;
  const bool mine = (t >> 1) == (blk & 1);
#pragma unroll
  for (int j = 0; j < kCpw; ++j) {
    const int c = warp + kWarps * j;
#pragma unroll
    for (int i = 0; i < 8; ++i) b[j][i] = 0u;
    sx[j][0] = sx[j][1] = 0.0f;
    if (c >= chunks) continue;
    if (mine) {
      const int col = c * kChunkCols + (hi_half ? 64 : 0) + 16 * t;
      const float m = amax[col / 32];
      const float inv = m > 0.0f ? 127.0f / m : 0.0f;
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
        const uint32_t word = Pack4(q[0], q[1], q[2], q[3]);
        b[j][k] = hi_half ? 0u : word;  // constant indices: b stays in registers
        b[j][4 + k] = hi_half ? word : 0u;
      }
    }
    // C columns 2t, 2t + 1: term t / 2 of the chunk's blocks 2(t & 1) and 2(t & 1) + 1.
    const int b0 = c * (kChunkCols / 32) + 2 * (t & 1);
    const float f = (t >> 1) ? 1.0f / (127.0f * kLoSteps) : 1.0f / 127.0f;
    sx[j][0] = amax[b0] * f;
    sx[j][1] = amax[b0 + 1] * f;
  }
}

// acc0 / acc1 (rows g, g + 8 of the tile at `tile`) += the lane's blocks of its chunks, scaled.
__device__ __forceinline__ void TileMma(const uint8_t* tile, int stride, const uint32_t (&b)[kCpw][8],
                                        const float (&sx)[kCpw][2], int warp, int chunks, int g, int t, float& acc0,
                                        float& acc1) {
  const uint8_t* row0 = tile + g * stride;
  const uint8_t* row1 = row0 + 8 * stride;
#pragma unroll
  for (int j = 0; j < kCpw; ++j) {
    const int c = warp + kWarps * j;
    if (c >= chunks) continue;
    const int sb = (c >> 1) * static_cast<int>(kQ8_0x8SuperBytes), h = c & 1;
    const int q = sb + 16 + 128 * h + 16 * t, s = sb + 8 * h + 4 * (t & 1);
    const uint4 lo0 = *reinterpret_cast<const uint4*>(row0 + q), hi0 = *reinterpret_cast<const uint4*>(row0 + q + 64);
    const uint4 lo1 = *reinterpret_cast<const uint4*>(row1 + q), hi1 = *reinterpret_cast<const uint4*>(row1 + q + 64);
    const uint32_t s0 = *reinterpret_cast<const uint32_t*>(row0 + s), s1 = *reinterpret_cast<const uint32_t*>(row1 + s);
    int d[4] = {0, 0, 0, 0};
    MmaS8(d, lo0.x, lo1.x, lo0.y, lo1.y, b[j][0], b[j][1]);
    MmaS8(d, lo0.z, lo1.z, lo0.w, lo1.w, b[j][2], b[j][3]);
    MmaS8(d, hi0.x, hi1.x, hi0.y, hi1.y, b[j][4], b[j][5]);
    MmaS8(d, hi0.z, hi1.z, hi0.w, hi1.w, b[j][6], b[j][7]);
    const float2 w0 = __half22float2(*reinterpret_cast<const __half2*>(&s0));
    const float2 w1 = __half22float2(*reinterpret_cast<const __half2*>(&s1));
    acc0 = fmaf(w0.x * sx[j][0], static_cast<float>(d[0]), acc0);
    acc0 = fmaf(w0.y * sx[j][1], static_cast<float>(d[1]), acc0);
    acc1 = fmaf(w1.x * sx[j][0], static_cast<float>(d[2]), acc1);
    acc1 = fmaf(w1.y * sx[j][1], static_cast<float>(d[3]), acc1);
  }
}

// The norm-in form's x = γ ⊙ ρ(H + y + g·shared) into xs4, with InjectRmsNormRegKernel's split and
// operations (norm_row.cuh; the same bits), from registers: γ (and H when its writer is two launches
// back) were read before the PDL wait into gm / hv. The caller's barrier follows.
constexpr int kMaxVec = 4;
__device__ __forceinline__ void FormX(const fastmv::StreamNormIn& n, int cols, const float4 (&gm)[kMaxVec],
                                      float4 (&hv)[kMaxVec], float4* xs4) {
  __shared__ float scratch[32];
  const int h4 = cols / 4;
  const bool mine = static_cast<int>(threadIdx.x) < n.threads;
  const bool with_shared = n.y != nullptr && n.shared != nullptr;
  const float g = with_shared ? norm_row::SharedGate(n.gate_logit, 0) : 1.0f;
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * n.threads;
    if (!mine || k >= n.vec || i >= h4) continue;
    float4 v = n.h_early ? hv[k] : __ldcg(reinterpret_cast<const float4*>(n.H) + i);
    if (n.y != nullptr) {
      float4 d = __ldcg(reinterpret_cast<const float4*>(n.y) + i);
      if (with_shared) d = norm_row::AddShared(d, g, __ldcg(reinterpret_cast<const float4*>(n.shared) + i));
      v = norm_row::InjectQuad(v, 1.0f, d);
    }
    hv[k] = v;
    ss = norm_row::AddSquares(ss, v);
  }
  ss = BlockSum(ss, scratch);
  const float scale = norm_row::RmsScale(ss, cols, n.eps);
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * n.threads;
    if (!mine || k >= n.vec || i >= h4) continue;
    xs4[i] = norm_row::NormQuad(gm[k], hv[k], scale);
  }
}

template <bool kNormIn>
__global__ void __launch_bounds__(kThreads, 1) ResidentMatVecKernel(const ResidentArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int tiles_per_block = a.tiles_per_block;
  float* xs = reinterpret_cast<float*>(smem + XOffset(a.cols, tiles_per_block));
  float* amax = reinterpret_cast<float*>(smem + AmaxOffset(a.cols, tiles_per_block));
  float* red = reinterpret_cast<float*>(smem + RedOffset(a.cols, tiles_per_block));
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + BarOffset(a.cols, tiles_per_block));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int chunks = a.cols / kChunkCols, stride = RowStride(a.cols);
  const int tiles = (a.rows + kTileRows - 1) / kTileRows;
  const int first = static_cast<int>(blockIdx.x) * tiles_per_block;
  const int count = max(0, min(tiles_per_block, tiles - first));
  const uint32_t row_natural = static_cast<uint32_t>(Q8_0x8RowBytes(a.cols));

  // Every row of the run asked for before the wait (weights only): tile k completes bars[k].
  if (threadIdx.x == 0) {
    for (int k = 0; k < count; ++k) mbarrier::Init(static_cast<uint32_t>(__cvta_generic_to_shared(bars + k)), 1);
    mbarrier::InitFence();
  }
  __syncthreads();
  if (warp == 0) {
    for (int k = 0; k < count; ++k) {
      const int row0 = (first + k) * kTileRows, rows = min(kTileRows, a.rows - row0);
      const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(bars + k));
      if (lane == 0) mbarrier::ArriveExpectTx(bar, static_cast<uint32_t>(rows) * row_natural);
      __syncwarp();
      if (lane < rows) {
        const uint32_t dst = static_cast<uint32_t>(
            __cvta_generic_to_shared(smem + (static_cast<size_t>(k) * kTileRows + lane) * stride));
        mbarrier::BulkCopyToShared(dst, a.w + static_cast<int64_t>(row0 + lane) * a.row_bytes, row_natural, bar);
      }
    }
  }
  [[maybe_unused]] float4 gm[kMaxVec], hv[kMaxVec];
  if constexpr (kNormIn) {
    const fastmv::StreamNormIn& n = a.norm;
#pragma unroll
    for (int k = 0; k < kMaxVec; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * n.threads;
      if (static_cast<int>(threadIdx.x) < n.threads && k < n.vec && i < a.cols / 4) {
        gm[k] = __ldg(reinterpret_cast<const float4*>(n.gamma) + i);
        if (n.h_early) hv[k] = __ldcg(reinterpret_cast<const float4*>(n.H) + i);
      }
    }
  }
  PdlWaitForPrevious();
  PdlAllowNext();

  float4* xs4 = reinterpret_cast<float4*>(xs);
  if constexpr (kNormIn) {
    FormX(a.norm, a.cols, gm, hv, xs4);
  } else {
    for (int i = threadIdx.x; i < a.cols / 4; i += kThreads) xs4[i] = __ldg(reinterpret_cast<const float4*>(a.x) + i);
  }
  __syncthreads();
  for (int blk = warp; blk < a.cols / 32; blk += kWarps) {
    float m = fabsf(xs[blk * 32 + lane]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    if (lane == 0) amax[blk] = m;
  }
  __syncthreads();
  uint32_t b[kCpw][8];
  float sx[kCpw][2];
  BuildActivations(xs, amax, warp, chunks, g, t, b, sx);

  for (int k = 0; k < count; ++k) {
    mbarrier::WaitParity(static_cast<uint32_t>(__cvta_generic_to_shared(bars + k)), 0);
    float acc0 = 0.0f, acc1 = 0.0f;
    TileMma(smem + static_cast<size_t>(k) * kTileRows * stride, stride, b, sx, warp, chunks, g, t, acc0, acc1);
    acc0 += __shfl_xor_sync(0xFFFFFFFFu, acc0, 1);
    acc1 += __shfl_xor_sync(0xFFFFFFFFu, acc1, 1);
    acc0 += __shfl_xor_sync(0xFFFFFFFFu, acc0, 2);
    acc1 += __shfl_xor_sync(0xFFFFFFFFu, acc1, 2);
    // red[k & 1] is written again two tiles later, after a barrier its reader has passed.
    float* r = red + (k & 1) * kWarps * kTileRows;
    if (t == 0) {
      r[warp * kTileRows + g] = acc0;
      r[warp * kTileRows + g + 8] = acc1;
    }
    __syncthreads();
    if (threadIdx.x < kTileRows) {
      const int row = (first + k) * kTileRows + static_cast<int>(threadIdx.x);
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += r[w * kTileRows + threadIdx.x];
      if (row < a.rows) a.y[row] = s;
    }
  }
}

// The tiles a block takes (a run over the fewest blocks of one wave) and the launch's shared
// memory; 0 tiles where a block's run would not fit the device's shared memory.
struct ResidentPlan {
  int tiles_per_block = 0, blocks = 0;
  size_t smem = 0;
};
ResidentPlan PlanFor(int cols, int rows) {
  static const int optin = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      return 0;
    }
    return v;
  }();
  static const int sms = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      return 0;
    }
    return v;
  }();
  ResidentPlan p;
  if (sms <= 0 || rows <= 0) return p;
  const int tiles = (rows + kTileRows - 1) / kTileRows;
  const int per = (tiles + sms - 1) / sms;
  // The kernel's static shared memory (FormX's scratch, BlockSum's) stays under 1 KB.
  if (SharedBytes(cols, per) + 1024 > static_cast<size_t>(optin)) return p;
  p.tiles_per_block = per;
  p.blocks = (tiles + per - 1) / per;
  p.smem = SharedBytes(cols, per);
  return p;
}

template <bool kNormIn>
cudaError_t Launch(ResidentArgs a, cudaStream_t stream) {
  const ResidentPlan p = PlanFor(a.cols, a.rows);
  if (p.tiles_per_block == 0) return cudaErrorInvalidValue;
  auto kernel = ResidentMatVecKernel<kNormIn>;
  static std::atomic<size_t> raised{48 * 1024};
  if (const cudaError_t e = RaiseDynamicSmemLimit(kernel, p.smem, raised); e != cudaSuccess) return e;
  a.tiles_per_block = p.tiles_per_block;
  return LaunchPdl(kernel, dim3(static_cast<unsigned>(p.blocks)), dim3(kThreads), p.smem, stream, a);
}

ResidentArgs ArgsFor(const DeviceMatrix& w, float* y) {
  ResidentArgs a;
  a.w = static_cast<const uint8_t*>(w.data);
  a.row_bytes = w.row_bytes;
  a.cols = static_cast<int>(w.cols);
  a.rows = static_cast<int>(w.rows);
  a.y = y;
  return a;
}

std::atomic<bool>& ResidentSwitch() {
  static std::atomic<bool> on{EnvSwitchDefaultOn("TANDEM_RESIDENT_MATVEC")};
  return on;
}

}  // namespace

bool ResidentMatVec() { return ResidentSwitch().load(std::memory_order_relaxed); }
void SetResidentMatVec(bool on) { ResidentSwitch().store(on, std::memory_order_relaxed); }

bool ResidentMatVecTakes(const DeviceMatrix& w) {
  if (!Q8_0x8RowsAligned(w) || w.cols > kMaxCols || w.rows <= 0 || w.rows >= (int64_t{1} << 30)) return false;
  return PlanFor(static_cast<int>(w.cols), static_cast<int>(w.rows)).tiles_per_block > 0;
}

cudaError_t LaunchResidentMatVec(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream) {
  if (!ResidentMatVecTakes(w) || x == nullptr || y == nullptr || reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  ResidentArgs a = ArgsFor(w, y);
  a.x = x;
  return Launch<false>(a, stream);
}

bool ResidentMatVecNormInTakes(const DeviceMatrix& w) {
  const norm_row::RegSplit split = norm_row::RegSplitFor(w.cols / 4);
  return ResidentMatVecTakes(w) && split.vec > 0 && split.vec <= kMaxVec && split.threads <= kThreads;
}

cudaError_t LaunchResidentMatVecNormIn(const DeviceMatrix& w, const MatVecNormIn& in, float* y, cudaStream_t stream) {
  if (!ResidentMatVecNormInTakes(w) || in.H == nullptr || in.gamma == nullptr || y == nullptr ||
      (in.sh.shared != nullptr && in.y == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const norm_row::RegSplit split = norm_row::RegSplitFor(w.cols / 4);
  ResidentArgs a = ArgsFor(w, y);
  a.norm.H = in.H;
  a.norm.y = in.y;
  a.norm.shared = in.sh.shared;
  a.norm.gate_logit = in.sh.gate_logit;
  a.norm.gamma = in.gamma;
  a.norm.eps = in.eps;
  a.norm.vec = split.vec;
  a.norm.threads = split.threads;
  a.norm.h_early = in.h_written_earlier && !OldNormEarlyH();  // as LaunchDenseMatVecNormIn
  return Launch<true>(a, stream);
}

}  // namespace tandem::cuda
