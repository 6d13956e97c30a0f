#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"

#include <cuda_fp16.h>

#include <atomic>

#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/norm_route_block.cuh"
#include "gpu_service/backends/cuda/kernels/norm_row.cuh"
#include "gpu_service/backends/cuda/moe/mmq_quantize.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kNormThreads = 256;

// Four normed values (token t, stream s, columns 4i..4i+3 of the stream's h) into the f16 rows a
// prepared product reads (gemm_plan.h, DenseGemm::F16Input; a token's row spans its S streams):
// kCopies 1: f16(v), rows of S·h; 3: split rows [lo | hi | hi] of 3·S·h (gemm.cuh) with
// hi = f16(v) and lo = f16(v − hi). The same roundings (to nearest even) as F32ToF16 / F32ToF16SplitRows, so the
// rows are bit for bit what the norm followed by that conversion leaves. 8-byte stores.
template <int kCopies>
__device__ __forceinline__ void StoreF16Values(uint16_t* N16, int64_t t, int64_t s, int64_t S, int64_t h, int64_t i,
                                               float4 v) {
  const int64_t cols = S * h;
  uint16_t* p = N16 + t * kCopies * cols + s * h + 4 * i;
  const __half2 h01 = __floats2half2_rn(v.x, v.y), h23 = __floats2half2_rn(v.z, v.w);
  const uint2 hi = make_uint2(*reinterpret_cast<const uint32_t*>(&h01), *reinterpret_cast<const uint32_t*>(&h23));
  if constexpr (kCopies == 3) {
    *reinterpret_cast<uint2*>(p + kSplitHiThird * cols) = hi;
    *reinterpret_cast<uint2*>(p + (kSplitHiThird + 1) * cols) = hi;
    const float2 f01 = __half22float2(h01), f23 = __half22float2(h23);
    const __half2 l01 = __floats2half2_rn(v.x - f01.x, v.y - f01.y), l23 = __floats2half2_rn(v.z - f23.x, v.w - f23.y);
    *reinterpret_cast<uint2*>(p + kSplitLoThird * cols) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&l01), *reinterpret_cast<const uint32_t*>(&l23));
  } else {
    *reinterpret_cast<uint2*>(p) = hi;
  }
}

// The folded MMQ quantization (NormMmqOut, S = 1): the block's normed row r was staged in
// shared memory by StageRow; after the barrier each warp quantizes 256-element groups of it with
// LaunchMmqQuantize's body (lane l: elements 8l .. 8l + 7 of the group).
__device__ __forceinline__ void QuantizeStagedRow(const float* row_smem, int64_t t, int64_t h, const NormMmqOut& q) {
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  const int groups = static_cast<int>(h / 256);
  for (int g = static_cast<int>(threadIdx.x) >> 5; g < groups; g += warps) {
    const float4 v0 = *reinterpret_cast<const float4*>(row_smem + g * 256 + lane * 8);
    const float4 v1 = *reinterpret_cast<const float4*>(row_smem + g * 256 + lane * 8 + 4);
    const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    mmq_quantize::QuantizeGroup(v, lane, t, g, static_cast<int>(h), q.hi, q.lo, q.scale, q.sumx);
  }
}

using norm_row::AddShared;
using norm_row::SharedGate;

// One block per (token, stream) row: optional inject, then the RMS norm. The second pass re-reads
// the row the first pass wrote, from L1/L2 (a row is a few KiB). kCopies > 0: also the f16 rows of
// StoreF16Values into N16 (and N may be nullptr: no f32 rows).
template <int kCopies>
__global__ void __launch_bounds__(kNormThreads)
InjectRmsNormKernel(float* H, int64_t S, int64_t h, const float* a, const float* y, const float* sh,
                    const float* sg, const float* gamma, float eps, float* N, uint16_t* N16, NormMmqOut q) {
  extern __shared__ float4 staged[];  // h floats when q.hi (NormMmqOut), else none
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;  // t·S + s
  const int64_t t = row / S, s = row % S;
  float4* hr = reinterpret_cast<float4*>(H + row * h);
  const float4* yr = y ? reinterpret_cast<const float4*>(y + t * h) : nullptr;
  // The shared term left out of y (PendingShared; the launch ensures y with it).
  const float4* sr = y && sh ? reinterpret_cast<const float4*>(sh + t * h) : nullptr;
  const float gs = sr ? SharedGate(sg, t) : 1.0f;
  const float as = (y && a) ? a[row] : 1.0f;
  const int64_t h4 = h / 4;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < h4; i += blockDim.x) {
    float4 v = hr[i];
    if (yr) {
      float4 d = yr[i];
      if (sr) d = AddShared(d, gs, sr[i]);
      v = norm_row::InjectQuad(v, as, d);
      hr[i] = v;
    }
    ss = norm_row::AddSquares(ss, v);
  }
  ss = BlockSum(ss, scratch);
  const float scale = norm_row::RmsScale(ss, h, eps);
  const float4* g = reinterpret_cast<const float4*>(gamma + s * h);
  float4* out = N != nullptr ? reinterpret_cast<float4*>(N + row * h) : nullptr;
  for (int64_t i = threadIdx.x; i < h4; i += blockDim.x) {
    const float4 v = hr[i];
    const float4 gg = g[i];
    const float4 r = norm_row::NormQuad(gg, v, scale);
    if (kCopies == 0 || N != nullptr) out[i] = r;
    if constexpr (kCopies > 0) StoreF16Values<kCopies>(N16, t, s, S, h, i, r);
    if (q.x16 != nullptr) StoreF16Values<1>(q.x16, t, 0, 1, h, i, r);  // S = 1 (NormMmqOk)
    if (q.hi != nullptr) staged[i] = r;
  }
  if (q.hi != nullptr) QuantizeStagedRow(reinterpret_cast<const float*>(staged), t, h, q);
}

// InjectRmsNormKernel with the row kept in registers between the sum of squares and the scaling
// (kVec float4 per thread, rows of up to 4·kThreads·kVec floats): H and y are read once, with all
// of a thread's loads in flight together, and the weights γ are read before the wait. The same
// operations per value as InjectRmsNormKernel.
constexpr unsigned kGeneralInjectRows = 4096;

// kRoute (NormRoute, one row): blocks past the first are route blocks (norm_route_block.cuh).
template <int kVec, int kThreads, int kCopies, bool kRoute = false>
__global__ void __launch_bounds__(kThreads)
InjectRmsNormRegKernel(float* H, int64_t S, int64_t h, const float* a, const float* y, const float* sh,
                       const float* sg, const float* gamma, float eps, float* N, uint16_t* N16, NormMmqOut q,
                       bool h_early, EarlierInject earlier, NormRoute route) {
  extern __shared__ float4 staged[];  // h floats when q.hi (NormMmqOut) or kRoute, else none
  __shared__ float scratch[32];
  if constexpr (kRoute) {
    if (blockIdx.x > 0) {
      NormRouteBlock<kVec, kThreads>(H, h, y, gamma, eps, earlier, route, scratch, staged);
      return;
    }
  }
  const int64_t row = blockIdx.x;  // t·S + s
  const int64_t t = row / S, s = row % S;
  const int64_t h4 = h / 4;
  const float4* g = reinterpret_cast<const float4*>(gamma + s * h);
  float4 gg[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t i = threadIdx.x + k * kThreads;
    gg[k] = i < h4 ? g[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float4* hr = reinterpret_cast<float4*>(H + row * h);
  float4 v[kVec], d[kVec], e[kVec];
  auto load_h = [&] {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int64_t i = threadIdx.x + k * kThreads;
      v[k] = i < h4 ? hr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  // h_early: H's row was last written two or more kernels back (LaunchInjectRmsNorm), so it is
  // read before the wait, overlapping the kernel before (it may have left L2 since).
  if (h_early) load_h();
  PdlWaitForPrevious();  // pdl.cuh: nothing else of the step is read or written before
  PdlAllowNext();
  if (!h_early) load_h();
  const float4* yr = y ? reinterpret_cast<const float4*>(y + t * h) : nullptr;
  // The shared term left out of y (PendingShared; the launch ensures y with it).
  const float4* sr = y && sh ? reinterpret_cast<const float4*>(sh + t * h) : nullptr;
  // The earlier read's inject (EarlierInject; the launch ensures S = 1 and no inject weights).
  const float4* er = earlier.y ? reinterpret_cast<const float4*>(earlier.y + t * h) : nullptr;
  const float4* esr = er && earlier.sh.shared ? reinterpret_cast<const float4*>(earlier.sh.shared + t * h) : nullptr;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t i = threadIdx.x + k * kThreads;
    d[k] = yr && i < h4 ? yr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    e[k] = er && i < h4 ? er[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if (sr) {
    const float gs = SharedGate(sg, t);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int64_t i = threadIdx.x + k * kThreads;
      if (i < h4) d[k] = AddShared(d[k], gs, sr[i]);
    }
  }
  if (esr) {
    const float gs = SharedGate(earlier.sh.gate_logit, t);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int64_t i = threadIdx.x + k * kThreads;
      if (i < h4) e[k] = AddShared(e[k], gs, esr[i]);
    }
  }
  const float as = (y && a) ? a[row] : 1.0f;
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t i = threadIdx.x + k * kThreads;
    if (i >= h4) break;
    // The earlier inject first, as its own read's norm would have added it.
    if (er) v[k] = norm_row::InjectQuad(v[k], 1.0f, e[k]);
    if (yr) v[k] = norm_row::InjectQuad(v[k], as, d[k]);
    if (!kRoute && (yr || er)) hr[i] = v[k];
    ss = norm_row::AddSquares(ss, v[k]);
  }
  if constexpr (kRoute) {
    // The route blocks read H before their wait: rewrite it only after all of them have.
    NormRouteWaitForReads(route);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int64_t i = threadIdx.x + k * kThreads;
      if (i >= h4) break;
      if (yr || er) hr[i] = v[k];
    }
  }
  ss = BlockSum(ss, scratch);
  const float scale = norm_row::RmsScale(ss, h, eps);
  float4* out = N != nullptr ? reinterpret_cast<float4*>(N + row * h) : nullptr;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t i = threadIdx.x + k * kThreads;
    if (i >= h4) break;
    const float4 r = norm_row::NormQuad(gg[k], v[k], scale);
    if (kCopies == 0 || N != nullptr) out[i] = r;
    if constexpr (kCopies > 0) StoreF16Values<kCopies>(N16, t, s, S, h, i, r);
    if (q.x16 != nullptr) StoreF16Values<1>(q.x16, t, 0, 1, h, i, r);  // S = 1 (NormMmqOk)
    if (q.hi != nullptr) staged[i] = r;
  }
  if (q.hi != nullptr) QuantizeStagedRow(reinterpret_cast<const float*>(staged), t, h, q);
}

__global__ void StreamFoldKernel(const float* N, const float* m, int64_t n, int64_t S, int64_t h,
                                 float* x) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * h) return;
  const int64_t t = i / h, j = i % h;
  float sum = 0.0f;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t off = (t * S + s) * h + j;
    sum += SigmoidF(m[off]) * N[off];
  }
  x[i] = (2.0f / static_cast<float>(S)) * sum;
}

__global__ void SiluKernel(float* v, int64_t count) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) v[i] = SiluF(v[i]);
}

__global__ void InjectWeightsKernel(const float* c, int64_t count, float* a) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) a[i] = c ? 2.0f * SigmoidF(c[i]) : 1.0f;
}

__global__ void StreamInjectKernel(float* H, int64_t S, int64_t h, const float* a, const float* y, const float* sh,
                                   const float* sg, int64_t total) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t row = i / h, j = i % h;  // row = t·S + s
  const int64_t t = row / S;
  float d = y[t * h + j];
  if (sh != nullptr) d = fmaf(SharedGate(sg, t), sh[t * h + j], d);  // PendingShared
  H[i] += (a != nullptr ? a[row] : 1.0f) * d;
}

unsigned Blocks(int64_t count, int threads) {
  return static_cast<unsigned>((count + threads - 1) / threads);
}

}  // namespace

namespace {

// The dispatch of LaunchInjectRmsNorm(F16) for one output form (kCopies 0: f32 rows only). q.hi
// set: the row staged in `smem` bytes of shared memory for the folded quantization.
template <int kCopies>
cudaError_t LaunchNormGeneral(float* H, int64_t n, int64_t S, int64_t h, const float* a, const float* y,
                              PendingShared sh, const float* gamma, float eps, float* N, uint16_t* N16, NormMmqOut q,
                              size_t smem, cudaStream_t stream) {
  return LaunchPdl(InjectRmsNormKernel<kCopies>, static_cast<unsigned>(n * S), kNormThreads, smem, stream, H, S, h, a, y,
                   sh.shared, sh.gate_logit, gamma, eps, N, N16, q);
}

// launch(InjectRmsNormRegKernel<...>) for the kernel of split's row-width bucket (vectors a thread,
// threads a block).
template <int kCopies, bool kRoute, typename Launch>
cudaError_t WithRegKernel(norm_row::RegSplit split, Launch launch) {
  if (split.threads == 128) {
    if (split.vec == 1) return launch(InjectRmsNormRegKernel<1, 128, kCopies, kRoute>);
    if (split.vec == 2) return launch(InjectRmsNormRegKernel<2, 128, kCopies, kRoute>);
    return launch(InjectRmsNormRegKernel<4, 128, kCopies, kRoute>);
  }
  if (split.vec == 2) return launch(InjectRmsNormRegKernel<2, 256, kCopies, kRoute>);
  return launch(InjectRmsNormRegKernel<4, 256, kCopies, kRoute>);
}

template <int kCopies>
cudaError_t LaunchNorm(float* H, int64_t n, int64_t S, int64_t h, const float* a, const float* y, PendingShared sh,
                       const float* gamma, float eps, float* N, uint16_t* N16, cudaStream_t stream,
                       const NormMmqOut* qp, bool h_early, EarlierInject earlier = {}, const NormRoute* route = nullptr) {
  const NormMmqOut q = qp != nullptr ? *qp : NormMmqOut{};
  const size_t smem = q.hi != nullptr || route != nullptr ? static_cast<size_t>(h) * sizeof(float) : 0;
  // Rows of up to 512 vectors: a block of 128 threads; longer (h 2048: 512 vectors) 256 threads,
  // up to 4 vectors each (rows of up to 4096 floats): norm_row::RegSplitFor.
  const int64_t h4 = h / 4;
  const unsigned rows = static_cast<unsigned>(n * S);
  const norm_row::RegSplit split = norm_row::RegSplitFor(h4);
  // Long prefill steps with the inject: the two-pass kernel measured ~3% faster at 8192 rows of h
  // 2048 (4.0 against 3.9 TB/s, both at the copy ceiling); the register kernel wins below.
  if ((y != nullptr && rows >= kGeneralInjectRows) || split.vec == 0) {
    if (earlier.y != nullptr || route != nullptr) return cudaErrorInvalidValue;  // the register kernel's alone
    return LaunchNormGeneral<kCopies>(H, n, S, h, a, y, sh, gamma, eps, N, N16, q, smem, stream);
  }
  // The route blocks' launch (NormRoute) writes f32 rows only: one norm block, then a block per
  // warps' worth of router rows (a row a warp).
  if (route != nullptr && kCopies != 0) return cudaErrorInvalidValue;
  const int route_rows_per_block = split.threads / 32;
  const unsigned blocks =
      route != nullptr ? 1u + static_cast<unsigned>((route->rows + route_rows_per_block - 1) / route_rows_per_block)
                       : rows;
  auto launch = [&](auto kernel) {
    return LaunchPdl(kernel, blocks, static_cast<unsigned>(split.threads), smem, stream, H, S, h, a, y, sh.shared,
                     sh.gate_logit, gamma, eps, N, N16, q, h_early && !OldNormEarlyH(), earlier,
                     route != nullptr ? *route : NormRoute{});
  };
  return route != nullptr ? WithRegKernel<0, true>(split, launch) : WithRegKernel<kCopies, false>(split, launch);
}

// The folded quantization's and the MoE f16 rows' conditions (NormMmqOut).
bool NormMmqOk(int64_t S, int64_t h, const NormMmqOut* q) {
  if (q == nullptr) return true;
  if (q->x16 != nullptr && (S != 1 || reinterpret_cast<uintptr_t>(q->x16) % 8 != 0)) return false;
  if (q->hi == nullptr) return true;
  return S == 1 && NormMmqFits(h) && q->lo != nullptr && q->scale != nullptr && q->sumx != nullptr &&
         reinterpret_cast<uintptr_t>(q->hi) % 8 == 0 && reinterpret_cast<uintptr_t>(q->lo) % 8 == 0;
}

bool NormShapeOk(int64_t n, int64_t S, int64_t h) { return S > 0 && h > 0 && h % 4 == 0 && n * S <= 0x7FFFFFFF; }

// The launches' PendingShared (none for nullptr or a null shared); false when it names a term
// but there is no y to add it to.
bool SharedOk(const float* y, const PendingShared* sh, PendingShared* out) {
  *out = sh != nullptr && sh->shared != nullptr ? *sh : PendingShared{};
  return out->shared == nullptr || y != nullptr;
}

ProcessSwitch g_old_norm_early_h{[] { return EnvSwitch("TANDEM_OLD_NORM_EARLY_H"); }};

}  // namespace

bool OldNormEarlyH() { return g_old_norm_early_h.on(); }
void SetOldNormEarlyH(bool on) { g_old_norm_early_h.set(on); }

cudaError_t LaunchInjectRmsNorm(float* H, int64_t n, int64_t S, int64_t h, const float* a,
                                const float* y, const float* gamma, float eps, float* N,
                                cudaStream_t stream, const NormMmqOut* q, const PendingShared* sh,
                                bool h_written_earlier, const EarlierInject* earlier, const NormRoute* route) {
  if (n <= 0) return cudaSuccess;
  PendingShared shared;
  if (!NormShapeOk(n, S, h) || N == nullptr || !NormMmqOk(S, h, q) || !SharedOk(y, sh, &shared)) {
    return cudaErrorInvalidValue;
  }
  if (route != nullptr &&
      (n != 1 || S != 1 || y == nullptr || a != nullptr || shared.shared != nullptr || !h_written_earlier ||
       OldNormEarlyH() || route->w == nullptr || route->rows <= 0 || route->parts == nullptr ||
       route->padded < route->rows || route->inv_scale == nullptr || route->logits == nullptr ||
       route->h_reads == nullptr ||
       reinterpret_cast<uintptr_t>(route->w) % 16 != 0)) {
    return cudaErrorInvalidValue;
  }
  EarlierInject e = earlier != nullptr ? *earlier : EarlierInject{};
  if (e.y == nullptr) {
    e = EarlierInject{};
  } else if (S != 1 || a != nullptr) {
    return cudaErrorInvalidValue;
  }
  return LaunchNorm<0>(H, n, S, h, a, y, shared, gamma, eps, N, nullptr, stream, q, h_written_earlier, e, route);
}

cudaError_t LaunchInjectRmsNormF16(float* H, int64_t n, int64_t S, int64_t h, const float* a, const float* y,
                                   const float* gamma, float eps, float* N, int copies, uint16_t* N16,
                                   cudaStream_t stream, const NormMmqOut* q, const PendingShared* sh,
                                   bool h_written_earlier) {
  if (n <= 0) return cudaSuccess;
  PendingShared shared;
  if (!NormShapeOk(n, S, h) || N16 == nullptr || reinterpret_cast<uintptr_t>(N16) % 8 != 0 || !NormMmqOk(S, h, q) ||
      !SharedOk(y, sh, &shared)) {
    return cudaErrorInvalidValue;
  }
  if (copies == 1) return LaunchNorm<1>(H, n, S, h, a, y, shared, gamma, eps, N, N16, stream, q, h_written_earlier);
  if (copies == 3) return LaunchNorm<3>(H, n, S, h, a, y, shared, gamma, eps, N, N16, stream, q, h_written_earlier);
  return cudaErrorInvalidValue;
}

cudaError_t LaunchInjectRmsNormGeneral(float* H, int64_t n, int64_t S, int64_t h, const float* a,
                                       const float* y, const float* gamma, float eps, float* N,
                                       cudaStream_t stream, const PendingShared* sh) {
  if (n <= 0) return cudaSuccess;
  PendingShared shared;
  if (!NormShapeOk(n, S, h) || N == nullptr || !SharedOk(y, sh, &shared)) return cudaErrorInvalidValue;
  return LaunchNormGeneral<0>(H, n, S, h, a, y, shared, gamma, eps, N, nullptr, NormMmqOut{}, 0, stream);
}

cudaError_t LaunchStreamFold(const float* N, const float* m, int64_t n, int64_t S, int64_t h,
                             float* x, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (S <= 0) return cudaErrorInvalidValue;
  return LaunchPdl(StreamFoldKernel, Blocks(n * h, 256), 256, 0, stream, N, m, n, S, h, x);
}

cudaError_t LaunchSiluInPlace(float* v, int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  return LaunchPdl(SiluKernel, Blocks(count, 256), 256, 0, stream, v, count);
}

cudaError_t LaunchInjectWeights(const float* c, int64_t count, float* a, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  return LaunchPdl(InjectWeightsKernel, Blocks(count, 256), 256, 0, stream, c, count, a);
}

cudaError_t LaunchStreamInject(float* H, int64_t n, int64_t S, int64_t h, const float* a,
                               const float* y, cudaStream_t stream, const PendingShared* sh) {
  const int64_t total = n * S * h;
  if (total <= 0) return cudaSuccess;
  PendingShared shared;
  if (!SharedOk(y, sh, &shared)) return cudaErrorInvalidValue;
  return LaunchPdl(StreamInjectKernel, Blocks(total, 256), 256, 0, stream, H, S, h, a, y, shared.shared,
                   shared.gate_logit, total);
}

}  // namespace tandem::cuda
