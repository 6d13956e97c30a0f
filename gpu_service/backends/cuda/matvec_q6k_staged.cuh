// The staged Q6_K decode matrix-vector kernel: y = W·x for 1..8 f32 activation rows, W in the
// ggml Q6_K layout (210-byte blocks of 256), f32 products and f32 accumulation. Built for the LM
// head (2048 -> 151936, 255 MB: the largest single read of a decode step); kernels/dense_matvec.cu
// sends large Q6_K matrices here (LaunchDenseMatVec's kAuto, or MatVecKernel::kStaged).
//
// Why it is shaped this way: Q6_K blocks are 2-byte aligned, so the register-streaming kernels
// (matvec_core.cuh, matvec_stream.cuh) read a 16-element piece with 7-10 narrow loads (4-byte
// words funnel-shifted into place); the head measured 1.8 TB/s there (tests/gpu/NOTES.md). A row
// of 2048 columns is 1680 = 105 · 16 bytes, so whole rows can travel global -> shared with 16-byte
// cp.async copies (coalesced 512-byte warp transactions, no registers held while in flight),
// and the narrow unaligned reads then hit shared memory instead of L1/L2.
// - Each warp owns a ring of kQ6Depth stages of kQ6Rows rows in shared memory and walks row
//   groups g, g + warps, ...: group g + (kQ6Depth - 1)·warps is copied while group g is decoded.
//   The first stages go out before PdlWaitForPrevious (weights only) and before x is staged.
// - A lane decodes a 64-element piece of a row (16 consecutive positions l of one half-block, all
//   four 32-column groups: three 16-byte spans ql0 / ql1 / qh, one scale per 16 elements), so
//   each scale is applied once per 16 products (the 16-element pieces of FmtQ6_K apply one per 4).
// - Activations sit in shared memory with a swizzle that keeps the eight lanes of a quarter-warp
//   (pieces 64 columns apart in pairs, 128 apart across pairs) on distinct 16-byte bank groups.
// Only .cu files include this header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_Q6K_STAGED_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_Q6K_STAGED_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/matvec_core.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda::fastmv {

inline constexpr int kQ6Rows = 2;    // rows per stage of a warp's ring
inline constexpr int kQ6Depth = 3;   // stages of the ring (kQ6Depth - 1 in flight while one is decoded)
inline constexpr int kQ6Warps = 8;
inline constexpr size_t kQ6MaxShared = 200 * 1024;

inline int64_t Q6RowBytes(int cols) { return static_cast<int64_t>(cols) / 256 * 210; }

// Activation rows, then the warps' rings.
inline size_t Q6StagedSharedBytes(int n_bucket, int cols) {
  return static_cast<size_t>(n_bucket) * cols * sizeof(float) +
         static_cast<size_t>(kQ6Warps) * kQ6Depth * kQ6Rows * Q6RowBytes(cols);
}

// True when the staged kernel takes the matrix: whole 16-byte rows (cols % 2048 == 0), 16-byte
// aligned data and stride, and one activation row plus the rings within kQ6MaxShared.
inline bool Q6StagedTakes(const void* w, int64_t cols, int64_t rows, int64_t row_bytes) {
  if (cols <= 0 || cols % 2048 != 0 || cols > 16384 || rows <= 0 || rows >= (int64_t{1} << 31)) return false;
  if (reinterpret_cast<uintptr_t>(w) % 16 != 0 || row_bytes % 16 != 0 || row_bytes < Q6RowBytes(static_cast<int>(cols))) {
    return false;
  }
  return Q6StagedSharedBytes(1, static_cast<int>(cols)) <= kQ6MaxShared;
}

struct Q6StagedArgs {
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
  int cols = 0, out_rows = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  int n = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
};

namespace {  // internal linkage, as in matvec_core.cuh

// The swizzle of activation float4 q: XOR bits 5-6 into bits 0-1 (a bijection on aligned groups
// of 128 float4s; cols % 2048 == 0).
__device__ __forceinline__ int Q6Swz(int q) { return q ^ ((q >> 5) & 3); }

// Four words from a 2-byte-aligned shared address: five aligned reads funnel-shifted.
__device__ __forceinline__ void Sh4At2(const uint8_t* p, uint32_t (&w)[4]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t s = static_cast<uint32_t>(a & 2) * 8;
  const uint32_t* q = reinterpret_cast<const uint32_t*>(p - (a & 2));  // keeps the shared address space
  uint32_t r[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) r[i] = q[i];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = __funnelshift_r(r[i], r[i + 1], s);
}

// Two words from a 2-byte-aligned shared address (the third aligned read only when unaligned, so
// that the scales at the end of a block never read past it).
__device__ __forceinline__ void Sh2At2(const uint8_t* p, uint32_t& w0, uint32_t& w1) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t s = static_cast<uint32_t>(a & 2) * 8;
  const uint32_t* q = reinterpret_cast<const uint32_t*>(p - (a & 2));  // keeps the shared address space
  const uint32_t lo = q[0], mid = q[1];
  const uint32_t hi = s ? q[2] : 0u;
  w0 = __funnelshift_r(lo, mid, s);
  w1 = __funnelshift_r(mid, hi, s);
}

// A 64-element piece P of a row in shared memory: block P / 4, half h = (P / 2) % 2, positions
// l = 16·(P % 2) .. +15 of the half; element (g, i, byte j) is column 256·b + 128·h + 32·g + l0 + 4i + j.
struct Q6Piece {
  uint32_t ql0[4], ql1[4], qh[4], sc0, sc1, d;
};

// The four 6-bit values (0..63, before their bias of 32) of word i of group g of a piece: the low
// nibbles of ql0 (g 0, 2) or ql1 (g 1, 3), the upper nibbles for g >= 2, two high bits from qh.
__device__ __forceinline__ uint32_t Q6Word(const Q6Piece& raw, int g, int i) {
  const uint32_t src = (g & 1) ? raw.ql1[i] : raw.ql0[i];
  const uint32_t low = (g >= 2 ? (src >> 4) : src) & 0x0F0F0F0Fu;
  const uint32_t qh = raw.qh[i];
  const uint32_t high = g == 0 ? (qh << 4) : g == 1 ? (qh << 2) : g == 2 ? qh : (qh >> 2);
  return low | (high & 0x30303030u);
}

// Piece P's signed scale of group g (its 16 values): byte 8h + l0/16 + 2g of the block's scales.
__device__ __forceinline__ int Q6Scale(const Q6Piece& raw, int P, int g) {
  const int b = (P & 1) + 2 * g;
  const uint32_t word = b < 4 ? raw.sc0 : raw.sc1;
  return static_cast<int8_t>(static_cast<uint8_t>(word >> (8 * (b & 3))));
}

__device__ __forceinline__ void LoadQ6Piece(const uint8_t* row, int P, Q6Piece& r) {
  const uint8_t* blk = row + (P >> 2) * 210;
  const int h = (P >> 1) & 1, l0 = 16 * (P & 1);
  Sh4At2(blk + 64 * h + l0, r.ql0);
  Sh4At2(blk + 64 * h + 32 + l0, r.ql1);
  Sh4At2(blk + 128 + 32 * h + l0, r.qh);
  Sh2At2(blk + 192 + 8 * h, r.sc0, r.sc1);  // the half's eight scales
  r.d = *reinterpret_cast<const uint16_t*>(blk + 208);
}

// acc[s][t] += piece P of row s · x_t.
template <int kS, int kN>
__device__ __forceinline__ void DotQ6Piece(const Q6Piece (&raw)[kS], int P, const float4* xs4, int quads,
                                           float (&acc)[kS][kN]) {
  const int base = 64 * (P >> 2) + 32 * ((P >> 1) & 1) + 4 * (P & 1);  // float4 index of (g = 0, i = 0)
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    float part[kS][kN];
#pragma unroll
    for (int s = 0; s < kS; ++s) {
#pragma unroll
      for (int t = 0; t < kN; ++t) part[s][t] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int slot = Q6Swz(base + 8 * g + i);
      float4 xv[kN];
#pragma unroll
      for (int t = 0; t < kN; ++t) xv[t] = xs4[t * quads + slot];
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const float4 q = BytesToFloat4<32>(Q6Word(raw[s], g, i));
#pragma unroll
        for (int t = 0; t < kN; ++t) {
          part[s][t] = FmaQuad(q, xv[t], part[s][t]);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const float scale = F16Bits(raw[s].d) * static_cast<float>(Q6Scale(raw[s], P, g));
#pragma unroll
      for (int t = 0; t < kN; ++t) acc[s][t] = fmaf(scale, part[s][t], acc[s][t]);
    }
  }
}

template <int kN>
__global__ void __launch_bounds__(kQ6Warps * 32, kN <= 2 ? 2 : 1) Q6StagedKernel(const Q6StagedArgs a) {
  extern __shared__ float4 q6_smem[];
  constexpr int kS = kQ6Rows, kD = kQ6Depth;
  const int cols = a.cols, quads = cols / 4, pieces = cols / 64;
  const int rb = cols / 256 * 210, rb16 = rb / 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float4* xs4 = q6_smem;
  uint8_t* ring = reinterpret_cast<uint8_t*>(q6_smem + kN * quads) + static_cast<int64_t>(warp) * kD * kS * rb;
  const int groups = (a.out_rows + kS - 1) / kS;
  const int wstep = static_cast<int>(gridDim.x) * kQ6Warps;
  const int t0 = static_cast<int>(blockIdx.y) * kN;
  const int rows_used = min(kN, a.n - t0);

  // Copies group gg's rows into ring slot `slot` (rows past the matrix clamped to its last row);
  // one commit group per call, empty ones too, so that the wait counts stay uniform.
  auto issue = [&](int gg, int slot) {
    if (gg < groups) {
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const int64_t row = min(gg * kS + s, a.out_rows - 1);
        const uint8_t* src = a.w + row * a.row_bytes;
        const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(ring + (slot * kS + s) * rb));
        for (int c = lane; c < rb16; c += 32) CpAsync16(dst + 16 * c, src + 16 * c);
      }
    }
    CpAsyncCommit();
  };
  int g = static_cast<int>(blockIdx.x) * kQ6Warps + warp;
#pragma unroll
  for (int j = 0; j < kD - 1; ++j) issue(g + j * wstep, j);
  // Weights only so far: the activations are the previous kernel's output (pdl.cuh).
  PdlWaitForPrevious();
  PdlAllowNext();
  for (int idx = threadIdx.x; idx < kN * quads; idx += blockDim.x) {
    const int t = idx / quads, q = idx - t * quads;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < rows_used) v = __ldg(reinterpret_cast<const float4*>(a.x + static_cast<int64_t>(t0 + t) * a.x_stride) + q);
    xs4[t * quads + Q6Swz(q)] = v;
  }
  __syncthreads();

  float* out = a.y + static_cast<int64_t>(t0) * a.y_stride;
  int slot = 0;
  for (; g < groups; g += wstep) {
    issue(g + (kD - 1) * wstep, (slot + kD - 1) % kD);
    CpAsyncWait<kD - 1>();
    __syncwarp();  // every lane's copies of this group have landed
    const uint8_t* st = ring + slot * kS * rb;
    float acc[kS][kN];
#pragma unroll
    for (int s = 0; s < kS; ++s) {
#pragma unroll
      for (int t = 0; t < kN; ++t) acc[s][t] = 0.0f;
    }
    for (int P = lane; P < pieces; P += 32) {
      Q6Piece raw[kS];
#pragma unroll
      for (int s = 0; s < kS; ++s) LoadQ6Piece(st + s * rb, P, raw[s]);
      DotQ6Piece<kS, kN>(raw, P, xs4, quads, acc);
    }
    __syncwarp();  // every lane is done with this slot before the next issue refills it
    slot = slot + 1 == kD ? 0 : slot + 1;
#pragma unroll
    for (int s = 0; s < kS; ++s) {
#pragma unroll
      for (int t = 0; t < kN; ++t) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[s][t] += __shfl_xor_sync(0xFFFFFFFFu, acc[s][t], off);
      }
    }
    if (lane == 0) {
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const int row = g * kS + s;
        if (row >= a.out_rows) break;
#pragma unroll
        for (int t = 0; t < kN; ++t) {
          if (t < rows_used) out[t * a.y_stride + row] = acc[s][t];
        }
      }
    }
  }
  CpAsyncWait<0>();  // the trailing (empty or clamped) copies land before the block exits
}

template <int kN>
cudaError_t LaunchQ6StagedN(const Q6StagedArgs& a, unsigned grid_y, int blocks_per_sm, cudaStream_t stream) {
  auto kernel = Q6StagedKernel<kN>;
  const size_t smem = Q6StagedSharedBytes(kN, a.cols);
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kQ6MaxShared));
  if (attr != cudaSuccess) return attr;
  int per_sm = blocks_per_sm;
  if (per_sm <= 0) {
    if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kQ6Warps * 32, smem);
        e != cudaSuccess) {
      return e;
    }
    per_sm = per_sm > 0 ? per_sm : 1;
  }
  const int64_t warps_needed = (static_cast<int64_t>(a.out_rows) + kQ6Rows - 1) / kQ6Rows;
  int64_t blocks = static_cast<int64_t>(DeviceSmCount()) * per_sm / grid_y;
  blocks = blocks < 1 ? 1 : blocks;
  const int64_t needed = (warps_needed + kQ6Warps - 1) / kQ6Warps;
  if (blocks > needed) blocks = needed;
  return LaunchPdl(kernel, dim3(static_cast<unsigned>(blocks), grid_y), kQ6Warps * 32, smem, stream, a);
}

}  // namespace

// Dense y = W·x through the staged kernel (Q6StagedTakes must hold): the activation-row bucket
// is the smallest of 1, 2, 4, 8 holding n whose shared memory fits kQ6MaxShared; more rows run as
// grid.y chunks. blocks_per_sm > 0 forces the grid (benchmarks).
inline cudaError_t LaunchQ6Staged(const uint8_t* w, int64_t row_bytes, int cols, int rows, const float* x,
                                  int64_t x_stride, int n, float* y, int64_t y_stride, int blocks_per_sm,
                                  cudaStream_t stream) {
  const int bucket = RowBucket(n, kQ6MaxShared, [cols](int b) { return Q6StagedSharedBytes(b, cols); });
  Q6StagedArgs a;
  a.w = w;
  a.row_bytes = row_bytes;
  a.cols = cols;
  a.out_rows = rows;
  a.x = x;
  a.x_stride = x_stride;
  a.n = n;
  a.y = y;
  a.y_stride = y_stride;
  const unsigned gy = static_cast<unsigned>((n + bucket - 1) / bucket);
  return ForRowBucket(bucket, [&](auto rows) { return LaunchQ6StagedN<rows.value>(a, gy, blocks_per_sm, stream); });
}

}  // namespace tandem::cuda::fastmv

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_Q6K_STAGED_CUH_
