// The batch-1 Q6_K LM-head kernel: y = W·x for ONE f32 activation row and 2048 columns (the
// q3n-80b head, 2048 -> 151936, 255 MB), W in the ggml Q6_K layout with 16-byte aligned rows.
// kernels/dense_matvec.cu sends the head here at n = 1 (kAuto; MatVecKernel::kStaged asks for the
// staged kernel, MatVecKernel::kQ6Head for this one at any size).
//
// It is the staged kernel (matvec_q6k_staged.cuh) with the shared-memory traffic of the
// activations taken out, a deeper copy ring and a cheaper final reduction:
// - At 2048 columns a row has 32 pieces of 64 elements, one per lane, and lane P always decodes
//   piece P. So the lane's 64 activations live in registers for the whole kernel (16 float4
//   loads from global after PdlWaitForPrevious); the staged kernel read them back from shared
//   memory with 16 LDS.128 per piece (per two rows), about 45% of its shared-memory wavefronts
//   and the likely throttle of its decode loop (not profiled).
// - Without the activations in shared memory there is no block barrier and the whole budget goes
//   to the warps' rings: kD stages of kS rows, kD - 1 groups in flight while one is decoded.
// - The kS row sums are reduced across the warp by a transposed butterfly (each xor step halves
//   the values a lane holds until one is left): kS - 1 + 5 - log2(kS) shuffles for kS rows
//   (5 for 2, 6 for 4) instead of 5·kS. Floating-point addition is commutative, and every lane adds the same pairs
//   in the same tree as the plain butterfly, so the sums are bit-identical to it.
// Arithmetic order: per row, piece P = lane, the same part/scale order as DotQ6Piece and the same
// xor tree: the outputs equal the staged kernel's bit for bit (gpu_kernels_test checks this).
// The int16 form (kI16, MatVecOptions::int16_x; the fast mode's head): each lane quantizes its 64
// activations to int16 with one scale (max |x| / 32767) and sums a 16-element scale group as
// integers, eight dp2a of the raw 6-bit values, less 32 · Σx for their bias. Why: decoding a Q6_K
// element to f32 (mask, byte to float, subtract, FMA) is ~4 instructions, ~290 a row for a lane,
// about 50 us of issue for the head's 151936 rows on 132 SMs, against a 56 us read at the H200's
// HBM rate (the f32 kernel measured 72 us there, tests/gpu/NOTES.md); the integer form issues
// about half as many. Error: ~1e-5 of a row's Σ|w·x| (x's rounding); not for the exact mode.
// Only .cu files include this header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_Q6K_HEAD_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_Q6K_HEAD_CUH_

#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/dp2a.cuh"
#include "gpu_service/backends/cuda/matvec_q6k_staged.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda::fastmv {

inline constexpr int kQ6HeadCols = 2048;
inline constexpr int kQ6HeadRowBytes = kQ6HeadCols / 256 * 210;  // 1680 = 105 · 16
inline constexpr size_t kQ6HeadMaxShared = 227 * 1024;           // the sm_90 per-block opt-in limit

// The compiled configurations (MatVecOptions::variant picks one; 0 is the default):
// rows per stage kS, ring stages kD, warps per block kW, blocks per SM the grid is sized for.
struct Q6HeadConfig {
  int rows, depth, warps, blocks_per_sm;
};
inline constexpr Q6HeadConfig kQ6HeadConfigs[] = {
    {4, 2, 8, 2},  // 0: fewer reductions (4 rows a group), 1 group in flight a warp; the fastest
                   //    on the H200 (2026-12-01, graph-timed head: 72.1 us against 75.2 for entry 1)
    {2, 4, 8, 2},  // 1: 16 warps/SM, 3 groups (10 KB) in flight a warp, 215 KB of rings an SM
    {2, 3, 8, 2},  // 2: the staged kernel's ring (3 x 2 rows), without its activations
    {1, 8, 8, 2},  // 3: one row a stage, 7 in flight
    {2, 5, 4, 3},  // 4: 12 warps/SM (up to 168 registers), 4 groups in flight a warp
};
inline constexpr int kQ6HeadVariants = static_cast<int>(sizeof(kQ6HeadConfigs) / sizeof(kQ6HeadConfigs[0]));

inline size_t Q6HeadSharedBytes(const Q6HeadConfig& c) {
  return static_cast<size_t>(c.warps) * c.depth * c.rows * kQ6HeadRowBytes;
}

// True when the head kernel takes the product: one activation row, 2048 columns, 16-byte
// aligned data and row stride (the staged kernel's copy rule).
inline bool Q6HeadTakes(const void* w, int64_t cols, int64_t rows, int64_t row_bytes, int n) {
  return n == 1 && cols == kQ6HeadCols && Q6StagedTakes(w, cols, rows, row_bytes);
}

struct Q6HeadArgs {
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
  int out_rows = 0;
  const float* x = nullptr;
  float* y = nullptr;
  // When set, the kernel writes to *y_at (read after its wait) instead of y: a destination chosen
  // per step after a CUDA graph captured the launch (the caller's page-locked logits row, written
  // over PCIe while the head streams, instead of a copy after it).
  float* const* y_at = nullptr;
};

namespace {  // internal linkage, as in matvec_core.cuh

// Where lane P's piece lies in a row, fixed for the whole kernel: the 4-aligned byte offsets of
// its ql0 (ql1 at +32), qh and scale words, the 2-aligned offset of the block's d, and the funnel
// shift (16 when the piece's block, 210 · (P / 4) bytes into the row, starts 2 bytes past a word).
// LoadQ6Piece recomputes this from the address for every row; here it costs nothing per row.
struct Q6LaneOffsets {
  int ql, qh, sc, d;
  uint32_t shift;
};

__device__ __forceinline__ Q6LaneOffsets Q6OffsetsOf(int P) {
  const int blk = (P >> 2) * 210, h = (P >> 1) & 1, l0 = 16 * (P & 1);
  const int al = blk & ~3;  // blk is even: al = blk - (blk & 2), the word LoadQ6Piece starts at
  return Q6LaneOffsets{al + 64 * h + l0, al + 128 + 32 * h + l0, al + 192 + 8 * h, blk + 208,
                       static_cast<uint32_t>(blk & 2) * 8};
}

// LoadQ6Piece(row, P, r) with the offsets above: the same words, the same funnel shifts.
__device__ __forceinline__ void LoadQ6PieceAt(const uint8_t* row, const Q6LaneOffsets& o, Q6Piece& r) {
  const uint32_t* ql = reinterpret_cast<const uint32_t*>(row + o.ql);
  const uint32_t* qh = reinterpret_cast<const uint32_t*>(row + o.qh);
  const uint32_t* sc = reinterpret_cast<const uint32_t*>(row + o.sc);
  uint32_t w0[5], w1[5], wh[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) {
    w0[i] = ql[i];
    w1[i] = ql[8 + i];
    wh[i] = qh[i];
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    r.ql0[i] = __funnelshift_r(w0[i], w0[i + 1], o.shift);
    r.ql1[i] = __funnelshift_r(w1[i], w1[i + 1], o.shift);
    r.qh[i] = __funnelshift_r(wh[i], wh[i + 1], o.shift);
  }
  // The third scale word only when shifted: unshifted, the half-1 scales of a row's last block
  // end 2 bytes before the row's end (Sh2At2's rule).
  const uint32_t lo = sc[0], mid = sc[1];
  const uint32_t hi = o.shift ? sc[2] : 0u;
  r.sc0 = __funnelshift_r(lo, mid, o.shift);
  r.sc1 = __funnelshift_r(mid, hi, o.shift);
  r.d = *reinterpret_cast<const uint16_t*>(row + o.d);
}

// acc += piece P of one row · x, where xr holds the lane's 16 activation float4s in the order
// DotQ6Piece reads them ((g, i) -> xr[4g + i]). Same operations in the same order as
// DotQ6Piece<1, 1>, so the same bits.
__device__ __forceinline__ float DotQ6PieceRegs(const Q6Piece& raw, int P, const float4 (&xr)[16], float acc) {
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 q = BytesToFloat4<32>(Q6Word(raw, g, i));
      part = FmaQuad(q, xr[4 * g + i], part);
    }
    const float scale = F16Bits(raw.d) * static_cast<float>(Q6Scale(raw, P, g));
    acc = fmaf(scale, part, acc);
  }
  return acc;
}

// A lane's 64 activations (xr, DotQ6PieceRegs' order) as int16 pairs: xp[2k] holds elements 4k,
// 4k + 1 and xp[2k + 1] elements 4k + 2, 4k + 3 of that order, round(x / scale) with scale =
// max |x| / 32767 (0 when every x is 0, NaN when one is not finite, so that the row sums are NaN
// as the f32 kernel's would be); sum16[g] is Σ of scale group g's 16 integers.
struct Q6LaneX16 {
  uint32_t xp[32];
  int sum16[4];
  float scale;
};

__device__ __forceinline__ void QuantizeLaneX16(const float4 (&xr)[16], Q6LaneX16& q) {
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const float e[4] = {xr[k].x, xr[k].y, xr[k].z, xr[k].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float m = fabsf(e[j]);
      finite = finite && m <= FLT_MAX;
      amax = fmaxf(amax, m);
    }
  }
  const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
  q.scale = finite ? amax / 32767.0f : __int_as_float(0x7FC00000);
#pragma unroll
  for (int g = 0; g < 4; ++g) q.sum16[g] = 0;
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int v0 = finite ? __float2int_rn(xr[k].x * inv) : 0, v1 = finite ? __float2int_rn(xr[k].y * inv) : 0;
    const int v2 = finite ? __float2int_rn(xr[k].z * inv) : 0, v3 = finite ? __float2int_rn(xr[k].w * inv) : 0;
    q.xp[2 * k] = (static_cast<uint32_t>(v0) & 0xFFFFu) | (static_cast<uint32_t>(v1) << 16);
    q.xp[2 * k + 1] = (static_cast<uint32_t>(v2) & 0xFFFFu) | (static_cast<uint32_t>(v3) << 16);
    q.sum16[k / 4] += v0 + v1 + v2 + v3;
  }
}

// Σ over the piece's four scale groups of sc_g · Σ (q - 32) · xq, the integer part of each group
// exact (|Σ| <= 16 · 32 · 32767, times |sc| <= 128: < 2^31) and converted once; the caller
// multiplies by the block's d and the lane's x scale.
__device__ __forceinline__ float DotQ6PieceI16(const Q6Piece& raw, int P, const Q6LaneX16& x) {
  float acc = 0.0f;
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    int s = -32 * x.sum16[g];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t q = Q6Word(raw, g, i);
      s = Dp2aLo(x.xp[8 * g + 2 * i], q, s);  // q's bytes are 0..63: the same as signed bytes
      s = Dp2aHi(x.xp[8 * g + 2 * i + 1], q, s);
    }
    acc += static_cast<float>(s * Q6Scale(raw, P, g));
  }
  return acc;
}

template <int kS, int kD, int kW, int kMinBlocks, bool kI16>
__global__ void __launch_bounds__(kW * 32, kMinBlocks) Q6HeadKernel(const Q6HeadArgs a) {
  static_assert(kS == 1 || kS == 2 || kS == 4 || kS == 8, "rows per stage: a power of two <= 8");
  static_assert(kD >= 2, "a ring of at least two stages");
  extern __shared__ float4 q6h_smem[];
  constexpr int kRb = kQ6HeadRowBytes, kRb16 = kRb / 16, kChunks = kS * kRb16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint8_t* ring = reinterpret_cast<uint8_t*>(q6h_smem) + static_cast<int64_t>(warp) * kD * kS * kRb;
  const int groups = (a.out_rows + kS - 1) / kS;
  const int wstep = static_cast<int>(gridDim.x) * kW;

  // Copies group gg's rows into ring slot `slot`; one commit group per call, empty ones too, so
  // that the wait counts stay uniform. The group's kS · 105 chunks are spread over the lanes as
  // one range (7 copies a lane at kS = 2, not 8). Rows past the matrix are not copied: their
  // slot rows hold stale bytes whose sums are never written (rows do not mix in the reduction).
  // At the natural stride (the head) the group is one contiguous range: one address a copy.
  const bool natural = a.row_bytes == kRb;
  const uint8_t* wl = a.w + 16 * lane;
  auto issue = [&](int gg, int slot) {
    if (gg < groups) {
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(ring + slot * kS * kRb)) + 16 * lane;
      const int limit = min(kS, a.out_rows - gg * kS) * kRb16;  // chunks of rows inside the matrix
      if (natural) {
        const uint8_t* src = wl + static_cast<int64_t>(gg) * (kS * kRb);
#pragma unroll
        for (int j = 0; j * 32 < kChunks; ++j) {
          if (lane + 32 * j < limit) CpAsync16(dst + 512 * j, src + 512 * j);
        }
      } else {
#pragma unroll
        for (int j = 0; j * 32 < kChunks; ++j) {
          const int c = lane + 32 * j;
          if (c < limit) {
            const int s = c / kRb16, k = c - s * kRb16;
            CpAsync16(dst + 512 * j, a.w + (static_cast<int64_t>(gg) * kS + s) * a.row_bytes + 16 * k);
          }
        }
      }
    }
    CpAsyncCommit();
  };
  int g = static_cast<int>(blockIdx.x) * kW + warp;
#pragma unroll
  for (int j = 0; j < kD - 1; ++j) issue(g + j * wstep, j);
  // Weights only so far: the activations are the previous kernel's output (pdl.cuh).
  PdlWaitForPrevious();
  PdlAllowNext();
  float* const y = a.y_at != nullptr ? *a.y_at : a.y;
  const int P = lane;
  const Q6LaneOffsets po = Q6OffsetsOf(P);
  float4 xr[16];
  {
    const int base = 64 * (P >> 2) + 32 * ((P >> 1) & 1) + 4 * (P & 1);  // float4 index of (g = 0, i = 0)
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
#pragma unroll
    for (int g4 = 0; g4 < 4; ++g4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) xr[4 * g4 + i] = __ldg(x4 + base + 8 * g4 + i);
    }
  }
  Q6LaneX16 xq;
  if constexpr (kI16) QuantizeLaneX16(xr, xq);

  int slot = 0;
  for (; g < groups; g += wstep) {
    issue(g + (kD - 1) * wstep, slot + kD - 1 >= kD ? slot - 1 : slot + kD - 1);
    CpAsyncWait<kD - 1>();
    __syncwarp();  // every lane's copies of this group have landed
    const uint8_t* st = ring + slot * kS * kRb;
    float v[kS];
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      Q6Piece raw;
      LoadQ6PieceAt(st + s * kRb, po, raw);
      if constexpr (kI16) {
        v[s] = DotQ6PieceI16(raw, P, xq) * (F16Bits(raw.d) * xq.scale);
      } else {
        v[s] = DotQ6PieceRegs(raw, P, xr, 0.0f);
      }
    }
    __syncwarp();  // every lane is done with this slot before the next issue refills it
    slot = slot + 1 == kD ? 0 : slot + 1;
    // Transposed butterfly: at xor offset `off` a lane keeps the half of its values selected by
    // (lane & off) and adds its partner's copy of that half; after log2(kS) steps one value is
    // left, row r = the lane's bits 4, 3, .. read as a number; the plain butterfly finishes.
    int cnt = kS;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      if (cnt > 1) {
        const bool upper = (lane & off) != 0;
#pragma unroll
        for (int j = 0; j < kS / 2; ++j) {
          if (j < cnt / 2) {
            const float send = upper ? v[j] : v[j + cnt / 2];
            const float keep = upper ? v[j + cnt / 2] : v[j];
            v[j] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, off);
          }
        }
        cnt >>= 1;
      } else {
        v[0] += __shfl_xor_sync(0xFFFFFFFFu, v[0], off);
      }
    }
    constexpr int kLanesPerRow = 32 / kS;
    if (lane % kLanesPerRow == 0) {
      const int row = g * kS + lane / kLanesPerRow;
      if (row < a.out_rows) y[row] = v[0];
    }
  }
  CpAsyncWait<0>();  // the trailing (empty or clamped) copies land before the block exits
}

template <int kVariant, bool kI16>
cudaError_t LaunchQ6HeadV(const Q6HeadArgs& a, int blocks_per_sm, cudaStream_t stream) {
  constexpr Q6HeadConfig c = kQ6HeadConfigs[kVariant];
  auto kernel = Q6HeadKernel<c.rows, c.depth, c.warps, c.blocks_per_sm, kI16>;
  const size_t smem = Q6HeadSharedBytes(c);
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  const int per_sm = blocks_per_sm > 0 ? blocks_per_sm : c.blocks_per_sm;
  const int64_t groups = (static_cast<int64_t>(a.out_rows) + c.rows - 1) / c.rows;
  const int64_t needed = (groups + c.warps - 1) / c.warps;
  int64_t blocks = static_cast<int64_t>(DeviceSmCount()) * per_sm;
  if (blocks > needed) blocks = needed;
  return LaunchPdl(kernel, dim3(static_cast<unsigned>(blocks)), c.warps * 32, smem, stream, a);
}

}  // namespace

// y = W·x for one activation row through the head kernel (Q6HeadTakes must hold). variant picks
// a configuration of kQ6HeadConfigs (cudaErrorInvalidValue outside 0..kQ6HeadVariants - 1);
// blocks_per_sm > 0 overrides its grid (benchmarks); y_at as Q6HeadArgs::y_at; int16_x: the int16
// form (kI16 above).
inline cudaError_t LaunchQ6Head(const uint8_t* w, int64_t row_bytes, int rows, const float* x, float* y, int variant,
                                int blocks_per_sm, float* const* y_at, bool int16_x, cudaStream_t stream) {
  Q6HeadArgs a;
  a.w = w;
  a.row_bytes = row_bytes;
  a.out_rows = rows;
  a.x = x;
  a.y = y;
  a.y_at = y_at;
  auto launch = [&](auto i16) -> cudaError_t {
    constexpr bool kI16 = decltype(i16)::value;
    switch (variant) {
      case 0: return LaunchQ6HeadV<0, kI16>(a, blocks_per_sm, stream);
      case 1: return LaunchQ6HeadV<1, kI16>(a, blocks_per_sm, stream);
      case 2: return LaunchQ6HeadV<2, kI16>(a, blocks_per_sm, stream);
      case 3: return LaunchQ6HeadV<3, kI16>(a, blocks_per_sm, stream);
      case 4: return LaunchQ6HeadV<4, kI16>(a, blocks_per_sm, stream);
      default: return cudaErrorInvalidValue;
    }
  };
  return int16_x ? launch(std::true_type{}) : launch(std::false_type{});
}

}  // namespace tandem::cuda::fastmv

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_Q6K_HEAD_CUH_
