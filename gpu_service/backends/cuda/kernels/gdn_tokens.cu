// The per-token GDN kernels on 16-byte vectors (gdn.cuh: LaunchGdnConv, LaunchGdnConvPrepare,
// LaunchGdnPrepare, LaunchGdnGatedNorm). All are memory-bound: a prefill step streams the qkv rows
// (c_dim floats per token) through the conv and the q/k norms, and the value rows through the gated
// norm. The scalar kernels (gdn.cu) moved one float per thread, a block per (token, head), and ran
// at ~0.8-1.1 TB/s on an H200; here lane l of a warp holds 4 consecutive channels, a warp covers 128
// channels, a head of dk channels is dk/4 adjacent lanes whose sums meet through shuffles (no shared
// memory, no block barrier), and each warp issues all loads of a run of tokens before the first use.
// The prefill path fuses the conv with the q/k norms and the gates (LaunchGdnConvPrepare): the conv
// results are normalised in registers, which removes the prepare pass over memory.
#include <cstdint>

#include <cuda_fp16.h>

#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_gates.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kLaneFloats = 4;                     // one float4 per lane
constexpr int kWarpChannels = 32 * kLaneFloats;    // channels per warp and token
constexpr int kVecWarps = 4;                       // warps per block of the conv and q/k kernels
// Tokens per warp in the conv and q/k kernels: the run's loads (kRunTokens + kk − 1 vectors per
// lane) are all in flight at once; the kk − 1 leading rows re-read the previous run's inputs (from L2).
// The tokens of a run are independent (no early exit between them), so their shuffle chains overlap.
constexpr int kRunTokens = 8;
// Below this many tokens the q/k kernel runs one token per warp: decode batches need the blocks
// spread over the SMs more than they need loads in flight per warp.
constexpr int64_t kShortRunBelow = kGdnPrepareShortRunBelow;  // gdn.cuh
// The gated norm: rows per lane group and threads per block for prefill, and below
// kGatedSmallRows rows (decode) one row per lane group in blocks of 64 threads (more blocks).
constexpr int kGatedRows = 4;
constexpr int kGatedThreads = 256;
constexpr int64_t kGatedSmallRows = 8192;
constexpr int kGatedSmallThreads = 64;

__device__ __forceinline__ float4 Load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void Store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ float4 Zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
__device__ __forceinline__ float SumSquares(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
__device__ __forceinline__ float Part(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;  // i is a constant after unrolling
}

// Sum of v over aligned groups of `group_lanes` adjacent lanes (a power of two <= 32). Every lane
// of the warp must call it.
__device__ __forceinline__ float GroupSum(float v, int group_lanes) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    if (o < group_lanes) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  }
  return v;
}

// What the q/k norms and the gates need (LaunchGdnPrepare's arguments).
struct GdnPrepareArgs {
  const float* ba;
  int64_t ba_stride;  // floats from one token's ba row to the next
  const float* ssm_a;
  const float* dt_bias;
  float* g;
  float* beta;
  int nk, nv, dk;
  float q_scale;
};

// The gates of tokens [t0, t0 + run) ∩ [0, n): the blocks of grid row 0 (scheduled first: their
// few, dependent loads finish under the channel blocks' streaming).
__device__ void GateRun(const GdnPrepareArgs& p, int64_t t0, int64_t n, int run) {
  const int r = p.nv / p.nk;
  for (int i = threadIdx.x; i < run * p.nv; i += blockDim.x) {
    const int64_t t = t0 + i / p.nv;
    if (t < n) GdnGate(p.ba, p.ba_stride, p.ssm_a, p.dt_bias, t, i % p.nv, r, p.nv, p.g, p.beta);
  }
}

// y: channels [c, c + 4) of one token. A head's dk/4 lanes are adjacent and start at a multiple of
// dk/4 (heads start at multiples of dk, warps at multiples of 128), so the group sum stays inside
// the head. q heads ← q/√(Σq²+1e-6)·q_scale, k heads ← k/√(Σk²+1e-6); other lanes keep y. Every lane
// of the warp must call it.
__device__ __forceinline__ float4 NormQkSlice(float4 y, int c, const GdnPrepareArgs& p) {
  const float ss = GroupSum(SumSquares(y), p.dk / kLaneFloats);
  if (c >= 2 * p.nk * p.dk) return y;
  float scale = rsqrtf(ss + 1e-6f);
  if (c < p.nk * p.dk) scale *= p.q_scale;
  return make_float4(y.x * scale, y.y * scale, y.z * scale, y.w * scale);
}

// Grid (token runs, [one row of gate blocks with kPrepare +] channel groups of kVecWarps·128).
// Warp w of channel group y computes the SiLU conv of channels [(y·kVecWarps + w)·128, +128) for
// tokens [x·kRunTokens, +kRunTokens), in the same order of operations as GdnConvKernel (the same
// bits). Run 0 also reads the history (the inputs before the first token) and then overwrites it
// with the last kk − 1 inputs: no other lane touches these channels' history, so no second kernel
// is needed. kPrepare: the q/k norms of the results before they are stored, and the gates. qkv's
// token rows are qkv_stride floats apart (history and out: c_dim).
template <int KK, bool kPrepare>
__global__ void __launch_bounds__(kVecWarps * 32)
GdnConvVecKernel(const float* __restrict__ qkv, int64_t qkv_stride, float* history, const float* __restrict__ taps,
                 int64_t n, int c_dim, float* __restrict__ out, GdnPrepareArgs p) {
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRunTokens;
  if (kPrepare && blockIdx.y == 0) {
    PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
    PdlAllowNext();
    GateRun(p, t0, n, kRunTokens);
    return;
  }
  const int lane = threadIdx.x & 31;
  const int group = blockIdx.y - (kPrepare ? 1 : 0);
  const int warp_c = (group * kVecWarps + (threadIdx.x >> 5)) * kWarpChannels;
  const int c = warp_c + lane * kLaneFloats;
  const bool active = c < c_dim;
  // Taps of the lane's channels, a constant weight (read before the wait): channel c + i's tap q at
  // taps[(c + i)·KK + q], 4·KK consecutive floats from a 16-byte boundary.
  float w[kLaneFloats * KK];
#pragma unroll
  for (int i = 0; i < KK; ++i) {
    const float4 v = active ? Load4(taps + static_cast<int64_t>(c) * KK + kLaneFloats * i) : Zero4();
    w[4 * i] = v.x;
    w[4 * i + 1] = v.y;
    w[4 * i + 2] = v.z;
    w[4 * i + 3] = v.w;
  }
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  if (warp_c >= c_dim) return;
  // x[i]: the input at token t0 − (KK − 1) + i; before token 0 it is history row KK − 1 + j.
  constexpr int kSpan = kRunTokens + KK - 1;
  float4 x[kSpan];
#pragma unroll
  for (int i = 0; i < kSpan; ++i) {
    const int64_t j = t0 - (KK - 1) + i;
    x[i] = Zero4();
    if (active && j < n) x[i] = j >= 0 ? Load4(qkv + j * qkv_stride + c) : Load4(history + (j + KK - 1) * c_dim + c);
  }
  if (blockIdx.x == 0 && active) {
    // history[q] ← input q + n of (history, qkv): an old history row (x[q + n], when n < KK − 1)
    // or a qkv row. This lane has read the old rows above.
#pragma unroll
    for (int q = 0; q < KK - 1; ++q) {
      const int64_t j = q + n;
      float4 v = x[0];
      if (j < KK - 1) {
#pragma unroll
        for (int i = 1; i < KK - 1; ++i) {
          if (i == j) v = x[i];
        }
      } else {
        v = Load4(qkv + (j - (KK - 1)) * qkv_stride + c);
      }
      Store4(history + static_cast<int64_t>(q) * c_dim + c, v);
    }
  }
#pragma unroll
  for (int r = 0; r < kRunTokens; ++r) {
    const int64_t t = t0 + r;  // past n: zero inputs, nothing stored
    float y[kLaneFloats];
#pragma unroll
    for (int i = 0; i < kLaneFloats; ++i) {
      float sum = 0.0f;
#pragma unroll
      for (int q = 0; q < KK - 1; ++q) sum = fmaf(w[i * KK + q], Part(x[r + q], i), sum);
      sum = fmaf(w[i * KK + KK - 1], Part(x[r + KK - 1], i), sum);
      y[i] = SiluF(sum);
    }
    float4 v = make_float4(y[0], y[1], y[2], y[3]);
    if (kPrepare) v = NormQkSlice(v, c, p);
    if (active && t < n) Store4(out + t * c_dim + c, v);
  }
}

// LaunchGdnPrepare in place: grid (token runs of kRun, one row of gate blocks + groups of
// kVecWarps·128 of the q/k channels); warp w of channel group y normalises channels
// [(y·kVecWarps + w)·128, +128) of tokens [x·kRun, +kRun).
template <int kRun>
__global__ void __launch_bounds__(kVecWarps * 32)
GdnNormQkVecKernel(float* conv_out, int64_t n, int c_dim, GdnPrepareArgs p) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRun;
  if (blockIdx.y == 0) {
    GateRun(p, t0, n, kRun);
    return;
  }
  const int lane = threadIdx.x & 31;
  const int warp_c = ((blockIdx.y - 1) * kVecWarps + (threadIdx.x >> 5)) * kWarpChannels;
  const int c = warp_c + lane * kLaneFloats;
  const int qk_end = 2 * p.nk * p.dk;
  if (warp_c >= qk_end) return;
  const bool active = c < qk_end;
  float4 x[kRun];
#pragma unroll
  for (int r = 0; r < kRun; ++r) {
    const int64_t t = t0 + r;
    x[r] = active && t < n ? Load4(conv_out + t * c_dim + c) : Zero4();
  }
#pragma unroll
  for (int r = 0; r < kRun; ++r) {
    const int64_t t = t0 + r;
    const float4 v = NormQkSlice(x[r], c, p);
    if (active && t < n) Store4(conv_out + t * c_dim + c, v);
  }
}

// rows = n·nv rows of dv values; a group of dv/4 adjacent lanes holds a row, a warp 32/(dv/4) rows
// at a time, kRows times over (all loads first). The same operations per value as
// GdnGatedNormKernel; out may alias o (each lane reads its values before writing them).
// Four values as f16 (round to nearest even) in 8 bytes; v keeps what the rounding left out.
__device__ __forceinline__ uint2 PackF16x4Residual(float4& v) {
  const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
  const float2 fa = __half22float2(a), fb = __half22float2(b);
  v = make_float4(v.x - fa.x, v.y - fa.y, v.z - fb.x, v.w - fb.y);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

// kF16 = 0: f32 rows into out. kF16 = 1 / 3: the rows of the output product's f16 input instead
// (DenseGemm::F16Input: [f16(v)] or split rows [lo | hi | hi] per token of nv·dv values, into out16), so that
// no separate conversion pass reads the f32 rows back. z's token rows are z_stride floats apart.
template <int kRows, int kThreads, int kF16 = 0>
__global__ void __launch_bounds__(kThreads)
GdnGatedNormVecKernel(const float* o, const float* __restrict__ z, int64_t z_stride, const float* __restrict__ norm,
                      float eps, int dv, int64_t rows, float* out, uint16_t* out16, int nv) {
  const int lane = threadIdx.x & 31;
  const int group_lanes = dv / kLaneFloats;
  const int groups = 32 / group_lanes;  // rows per warp and step
  const int col = (lane % group_lanes) * kLaneFloats;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  const int64_t first = warp * kRows * groups + lane / group_lanes;
  const float4 gamma = Load4(norm + col);  // a constant weight: read before the wait
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  float4 ov[kRows], zv[kRows];
#pragma unroll
  for (int s = 0; s < kRows; ++s) {
    const int64_t row = first + static_cast<int64_t>(s) * groups;
    ov[s] = row < rows ? Load4(o + row * dv + col) : Zero4();
    zv[s] = row < rows ? Load4(z + (row / nv) * z_stride + (row % nv) * dv + col) : Zero4();
  }
#pragma unroll
  for (int s = 0; s < kRows; ++s) {  // no early exit: the rows' shuffle chains overlap
    const int64_t row = first + static_cast<int64_t>(s) * groups;
    const float ss = GroupSum(SumSquares(ov[s]), group_lanes);
    const float scale = rsqrtf(ss / static_cast<float>(dv) + eps);
    const float4 a = ov[s], b = zv[s];
    const float4 v = make_float4(gamma.x * (a.x * scale) * SiluF(b.x), gamma.y * (a.y * scale) * SiluF(b.y),
                                 gamma.z * (a.z * scale) * SiluF(b.z), gamma.w * (a.w * scale) * SiluF(b.w));
    if constexpr (kF16 == 0) {
      if (row < rows) Store4(out + row * dv + col, v);
    } else if (row < rows) {
      const int64_t vw = static_cast<int64_t>(nv) * dv, t = row / nv;
      uint16_t* dst = out16 + t * kF16 * vw + (row % nv) * dv + col;
      float4 r = v;
      const uint2 hi = PackF16x4Residual(r);
      if constexpr (kF16 == 3) {  // split rows [lo | hi | hi] (gemm.cuh)
        *reinterpret_cast<uint2*>(dst + kSplitHiThird * vw) = hi;
        *reinterpret_cast<uint2*>(dst + (kSplitHiThird + 1) * vw) = hi;
        *reinterpret_cast<uint2*>(dst + kSplitLoThird * vw) = PackF16x4Residual(r);
      } else {
        *reinterpret_cast<uint2*>(dst) = hi;
      }
    }
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// A head size the lane groups can hold: a power of two from 4 to 128.
bool VecHeadDim(int dim) { return dim >= kLaneFloats && dim <= kWarpChannels && (dim & (dim - 1)) == 0; }

bool ConvVecApplies(const float* qkv, int64_t qkv_stride, const float* history, const float* taps, const GdnShape& d,
                    const float* out) {
  return d.c_dim() % kLaneFloats == 0 && qkv_stride % kLaneFloats == 0 && Aligned16(qkv) && Aligned16(taps) &&
         Aligned16(out) &&
         (d.kk == 1 || Aligned16(history));
}

unsigned Groups(int channels) {
  return static_cast<unsigned>((channels + kVecWarps * kWarpChannels - 1) / (kVecWarps * kWarpChannels));
}

template <bool kPrepare>
cudaError_t LaunchConvVec(const float* qkv, int64_t qkv_stride, float* history, const float* taps, int64_t n,
                          const GdnShape& d, float* out, const GdnPrepareArgs& p, cudaStream_t stream) {
  const int64_t runs = (n + kRunTokens - 1) / kRunTokens;
  if (runs > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(runs), (kPrepare ? 1 : 0) + Groups(d.c_dim()));
  const int c_dim = d.c_dim();
  switch (d.kk) {
    case 1: return LaunchPdl(GdnConvVecKernel<1, kPrepare>, grid, kVecWarps * 32, 0, stream, qkv, qkv_stride, history, taps, n, c_dim, out, p);
    case 2: return LaunchPdl(GdnConvVecKernel<2, kPrepare>, grid, kVecWarps * 32, 0, stream, qkv, qkv_stride, history, taps, n, c_dim, out, p);
    case 3: return LaunchPdl(GdnConvVecKernel<3, kPrepare>, grid, kVecWarps * 32, 0, stream, qkv, qkv_stride, history, taps, n, c_dim, out, p);
    case 4: return LaunchPdl(GdnConvVecKernel<4, kPrepare>, grid, kVecWarps * 32, 0, stream, qkv, qkv_stride, history, taps, n, c_dim, out, p);
    case 5: return LaunchPdl(GdnConvVecKernel<5, kPrepare>, grid, kVecWarps * 32, 0, stream, qkv, qkv_stride, history, taps, n, c_dim, out, p);
    case 6: return LaunchPdl(GdnConvVecKernel<6, kPrepare>, grid, kVecWarps * 32, 0, stream, qkv, qkv_stride, history, taps, n, c_dim, out, p);
    case 7: return LaunchPdl(GdnConvVecKernel<7, kPrepare>, grid, kVecWarps * 32, 0, stream, qkv, qkv_stride, history, taps, n, c_dim, out, p);
    case 8: return LaunchPdl(GdnConvVecKernel<8, kPrepare>, grid, kVecWarps * 32, 0, stream, qkv, qkv_stride, history, taps, n, c_dim, out, p);
    default: return cudaErrorInvalidValue;
  }
}

GdnPrepareArgs PrepareArgs(const float* ba, int64_t ba_stride, const float* ssm_a, const float* dt_bias,
                           const GdnShape& d, float* g, float* beta) {
  return GdnPrepareArgs{ba, ba_stride, ssm_a, dt_bias, g, beta, d.nk, d.nv, d.dk, rsqrtf(static_cast<float>(d.dk))};
}

// The row strides as the kernels take them: 0 is the width; narrower than the width is refused (-1).
int64_t Stride(int64_t stride, int64_t width) { return stride == 0 ? width : stride < width ? -1 : stride; }

}  // namespace

cudaError_t LaunchGdnConv(const float* qkv, float* history, const float* taps, int64_t n, const GdnShape& d, float* out,
                          cudaStream_t stream, int64_t qkv_stride) {
  if (n <= 0) return cudaSuccess;
  qkv_stride = Stride(qkv_stride, d.c_dim());
  if (d.kk < 1 || d.kk > kGdnMaxConvKernel || qkv_stride < 0) return cudaErrorInvalidValue;
  if (!ConvVecApplies(qkv, qkv_stride, history, taps, d, out)) {
    return LaunchGdnConvGeneral(qkv, history, taps, n, d, out, stream, qkv_stride);
  }
  return LaunchConvVec<false>(qkv, qkv_stride, history, taps, n, d, out, GdnPrepareArgs{}, stream);
}

cudaError_t LaunchGdnConvPrepare(const float* qkv, float* history, const float* taps, const float* ba,
                                 const float* ssm_a, const float* dt_bias, int64_t n, const GdnShape& d, float* out,
                                 float* g, float* beta, cudaStream_t stream, int64_t qkv_stride, int64_t ba_stride) {
  if (n <= 0) return cudaSuccess;
  qkv_stride = Stride(qkv_stride, d.c_dim());
  ba_stride = Stride(ba_stride, 2 * static_cast<int64_t>(d.nv));
  if (d.kk < 1 || d.kk > kGdnMaxConvKernel || d.nk <= 0 || d.nv % d.nk != 0 || qkv_stride < 0 || ba_stride < 0) {
    return cudaErrorInvalidValue;
  }
  if (!ConvVecApplies(qkv, qkv_stride, history, taps, d, out) || !VecHeadDim(d.dk)) {
    if (cudaError_t e = LaunchGdnConv(qkv, history, taps, n, d, out, stream, qkv_stride); e != cudaSuccess) return e;
    return LaunchGdnPrepare(out, ba, ssm_a, dt_bias, n, d, g, beta, stream, ba_stride);
  }
  return LaunchConvVec<true>(qkv, qkv_stride, history, taps, n, d, out,
                             PrepareArgs(ba, ba_stride, ssm_a, dt_bias, d, g, beta), stream);
}

cudaError_t LaunchGdnPrepare(float* conv_out, const float* ba, const float* ssm_a, const float* dt_bias, int64_t n,
                             const GdnShape& d, float* g, float* beta, cudaStream_t stream, int64_t ba_stride) {
  if (n <= 0) return cudaSuccess;
  ba_stride = Stride(ba_stride, 2 * static_cast<int64_t>(d.nv));
  if (d.nk <= 0 || d.nv % d.nk != 0 || ba_stride < 0) return cudaErrorInvalidValue;
  if (!VecHeadDim(d.dk) || d.c_dim() % kLaneFloats != 0 || !Aligned16(conv_out)) {
    return LaunchGdnPrepareGeneral(conv_out, ba, ssm_a, dt_bias, n, d, g, beta, stream, ba_stride);
  }
  const GdnPrepareArgs p = PrepareArgs(ba, ba_stride, ssm_a, dt_bias, d, g, beta);
  const unsigned rows = 1 + Groups(2 * d.nk * d.dk);
  if (n < kShortRunBelow) {
    return LaunchPdl(GdnNormQkVecKernel<1>, dim3(static_cast<unsigned>(n), rows), kVecWarps * 32, 0, stream, conv_out,
                     n, d.c_dim(), p);
  }
  const int64_t runs = (n + kRunTokens - 1) / kRunTokens;
  if (runs > 0x7FFFFFFF) return cudaErrorInvalidValue;
  return LaunchPdl(GdnNormQkVecKernel<kRunTokens>, dim3(static_cast<unsigned>(runs), rows), kVecWarps * 32, 0, stream,
                   conv_out, n, d.c_dim(), p);
}

cudaError_t LaunchGdnGatedNorm(const float* o, const float* z, const float* norm, float eps, int64_t n,
                               const GdnShape& d, float* out, cudaStream_t stream, int64_t z_stride) {
  if (n <= 0) return cudaSuccess;
  z_stride = Stride(z_stride, static_cast<int64_t>(d.nv) * d.dv);
  if (z_stride < 0 || d.nv <= 0) return cudaErrorInvalidValue;
  if (!VecHeadDim(d.dv) || !Aligned16(o) || !Aligned16(z) || z_stride % kLaneFloats != 0 || !Aligned16(norm) ||
      !Aligned16(out)) {
    return LaunchGdnGatedNormGeneral(o, z, norm, eps, n, d, out, stream, z_stride);
  }
  const int64_t rows = n * d.nv, rows_per_warp_step = 32 / (d.dv / kLaneFloats);
  if (rows < kGatedSmallRows) {
    const int64_t per_block = kGatedSmallThreads / 32 * rows_per_warp_step;
    return LaunchPdl(GdnGatedNormVecKernel<1, kGatedSmallThreads>, static_cast<unsigned>((rows + per_block - 1) / per_block),
                     kGatedSmallThreads, 0, stream, o, z, z_stride, norm, eps, d.dv, rows, out,
                     static_cast<uint16_t*>(nullptr), d.nv);
  }
  const int64_t per_block = kGatedThreads / 32 * kGatedRows * rows_per_warp_step;
  const int64_t blocks = (rows + per_block - 1) / per_block;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  return LaunchPdl(GdnGatedNormVecKernel<kGatedRows, kGatedThreads>, static_cast<unsigned>(blocks), kGatedThreads, 0,
                   stream, o, z, z_stride, norm, eps, d.dv, rows, out, static_cast<uint16_t*>(nullptr), d.nv);
}

cudaError_t LaunchGdnGatedNormToF16(float* o, const float* z, const float* norm, float eps, int64_t n,
                                    const GdnShape& d, bool split, uint16_t* out16, cudaStream_t stream,
                                    int64_t z_stride) {
  if (n <= 0) return cudaSuccess;
  const int64_t rows = n * d.nv, vw = static_cast<int64_t>(d.nv) * d.dv;
  z_stride = Stride(z_stride, vw);
  if (out16 == nullptr || z_stride < 0 || d.nv <= 0) return cudaErrorInvalidValue;
  if (!VecHeadDim(d.dv) || !Aligned16(o) || !Aligned16(z) || z_stride % kLaneFloats != 0 || !Aligned16(norm) ||
      reinterpret_cast<uintptr_t>(out16) % 8 != 0) {
    // The general kernel in place, then the conversion of its rows.
    if (cudaError_t e = LaunchGdnGatedNormGeneral(o, z, norm, eps, n, d, o, stream, z_stride); e != cudaSuccess) {
      return e;
    }
    return split ? LaunchF32ToF16SplitRows(o, n, vw, out16, stream) : LaunchF32ToF16(o, n * vw, out16, stream);
  }
  const int64_t per_block = kGatedThreads / 32 * kGatedRows * (32 / (d.dv / kLaneFloats));
  const int64_t blocks = (rows + per_block - 1) / per_block;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  if (split) {
    return LaunchPdl(GdnGatedNormVecKernel<kGatedRows, kGatedThreads, 3>, static_cast<unsigned>(blocks), kGatedThreads,
                     0, stream, o, z, z_stride, norm, eps, d.dv, rows, static_cast<float*>(nullptr), out16, d.nv);
  }
  return LaunchPdl(GdnGatedNormVecKernel<kGatedRows, kGatedThreads, 1>, static_cast<unsigned>(blocks), kGatedThreads, 0,
                   stream, o, z, z_stride, norm, eps, d.dv, rows, static_cast<float*>(nullptr), out16, d.nv);
}

}  // namespace tandem::cuda
