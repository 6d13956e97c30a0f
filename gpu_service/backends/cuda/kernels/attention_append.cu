// The per-token preparation of gated attention (attention.cuh): q and k per-head RMS norm with
// partial NeoX RoPE and the K/V append into the paged cache, as two kernels (LaunchQueryNormRope,
// LaunchKvAppend) or as one launch over both (LaunchQkvNormRopeAppend: the decode path, one launch
// fewer on the attention layer's critical path). Every block computes one head of one token with
// the same device code in either form, so both give the same bits.
#include <atomic>
#include <cmath>

#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/paged_kv.cuh"
#include "gpu_service/backends/cuda/kernels/rope_f64.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

// What NormRopeValue needs besides x, for thread i of a head: gamma[i] and the rotation's sin and cos
// at `pos` (f64, as the CPU reference). No kernel of the step writes any of it (weights, the host's
// positions), so the kernels take it before their PDL wait: the f64 sincos and the loads then run
// under the kernel before instead of on the layer's path after the wait.
struct NormRopeConsts {
  float gamma = 0.0f;
  double s = 0.0, c = 1.0;
};
__device__ __forceinline__ NormRopeConsts NormRopeConstsFor(const float* gamma, int rot, const double* inv_freq,
                                                           int64_t pos) {
  const int i = threadIdx.x;
  NormRopeConsts k;
  k.gamma = gamma[i];
  if (i < rot) {
    const int half = rot / 2;
    sincos(static_cast<double>(pos) * inv_freq[i < half ? i : i - half], &k.s, &k.c);
  }
  return k;
}

// y = RoPE_pos(gamma ⊙ ρ(x)) for one head of hd values, one thread per value (blockDim.x == hd).
// The rotation is computed in f64 like the CPU reference, with rope_f64.cuh's roundings.
// `pair` is hd floats of shared memory.
__device__ float NormRopeValue(float x, const NormRopeConsts& k, float eps, int hd, int rot, float* pair,
                               float* scratch) {
  const int i = threadIdx.x;
  const float ss = BlockSum(x * x, scratch);
  const float y = k.gamma * (x * rsqrtf(ss / static_cast<float>(hd) + eps));
  pair[i] = y;
  __syncthreads();
  const int half = rot / 2;
  if (i >= rot) return y;
  return i < half ? RopeLower(y, pair[i + half], k.s, k.c) : RopeUpper(y, pair[i - half], k.s, k.c);
}

// qg's token rows are qg_stride floats apart (at least nh·2hd).
__global__ void QueryNormRopeKernel(const float* qg, int64_t qg_stride, int nh, int hd, int rot, float eps,
                                    const float* q_norm, const double* inv_freq,
                                    const int32_t* token_pos, float* q_out) {
  const int64_t t = blockIdx.x;
  const NormRopeConsts k = NormRopeConstsFor(q_norm, rot, inv_freq, token_pos[t]);  // before the wait
  PdlWaitForPrevious();  // pdl.cuh: the step's rows only after it; nothing written before
  PdlAllowNext();
  extern __shared__ float pair[];
  __shared__ float scratch[32];
  const int h = blockIdx.y;
  const float x = qg[t * qg_stride + static_cast<int64_t>(h) * 2 * hd + threadIdx.x];
  const float y = NormRopeValue(x, k, eps, hd, rot, pair, scratch);
  q_out[(t * nh + h) * hd + threadIdx.x] = y;
}

// QueryNormRopeKernel's bits with one warp per (token, head) instead of one block: no barriers,
// no shared memory, kJ = hd/32 coalesced loads in flight per lane (the block kernel has one per
// thread and two __syncthreads per head: ~214 us for 8192 tokens × 16 heads of 256 on the H200,
// ~60 us of bytes). Lane l holds values 32j + l in x[j], the values thread 32j + l holds there:
//   - the sum of squares repeats BlockSum's operations: per j the butterfly of the block's warp j
//     (WarpSum over x[j]·x[j], the same per-lane expressions, so the same contraction), the value
//     of its lane 0 (what BlockSum stores in scratch[j]; the lanes of a butterfly may differ when
//     the first add is contracted into an fma) taken by lane j, the others 0, then WarpSum;
//   - then NormRopeValue's expressions in its order: ss / hd with hd a run-time value (the
//     division stays div.rn, as there), gamma[i] * (x * rsqrtf(..)), and the f64 rotation with
//     rope_f64.cuh's roundings (below). kH = half/32: the partner i ± half of
//     register j is register j ± kH of the same lane, and one sincos per lane and frequency serves
//     both halves (the block kernel computes the same sincos in two threads).
// Shapes: hd = 32·kJ, rot = 64·kH (half a multiple of 32); others take QueryNormRopeKernel.
template <int kJ, int kH>
__global__ void __launch_bounds__(256) QueryNormRopeWarpKernel(const float* qg, int64_t qg_stride, int64_t n, int nh,
                                                               int hd, float eps, const float* q_norm,
                                                               const double* inv_freq, const int32_t* token_pos,
                                                               float* q_out) {
  static_assert(kJ >= 1 && kH >= 0 && 2 * kH <= kJ);
  const int lane = threadIdx.x & 31;
  // The weights (q_norm, inv_freq: no kernel of the step writes them) before the wait.
  float gamma[kJ];
#pragma unroll
  for (int j = 0; j < kJ; ++j) gamma[j] = q_norm[32 * j + lane];
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);  // t·nh + h
  const bool live = w < n * nh;
  const int64_t t = live ? w / nh : 0;
  const int h = static_cast<int>(w - t * nh);
  // The positions come from the host before the step (pdl.cuh), so the rotation's f64 sincos is
  // computed before the wait too, off the path behind the previous kernel.
  double sn[kH > 0 ? kH : 1], cs[kH > 0 ? kH : 1];
  if (live) {
    const int64_t pos = token_pos[t];
#pragma unroll
    for (int j = 0; j < kH; ++j) sincos(static_cast<double>(pos) * inv_freq[32 * j + lane], &sn[j], &cs[j]);
  }
  PdlWaitForPrevious();  // pdl.cuh: every block waits before reading the step's rows
  PdlAllowNext();
  if (!live) return;
  const float* src = qg + t * qg_stride + static_cast<int64_t>(h) * 2 * hd + lane;
  float x[kJ];
#pragma unroll
  for (int j = 0; j < kJ; ++j) x[j] = src[32 * j];
  const float ss = WarpSumSquaresAsBlock<kJ>(x);
  const float r = rsqrtf(ss / static_cast<float>(hd) + eps);
  float y[kJ];
#pragma unroll
  for (int j = 0; j < kJ; ++j) y[j] = gamma[j] * (x[j] * r);
#pragma unroll
  for (int j = 0; j < kH; ++j) {
    const float lo = y[j], hi = y[j + kH];
    y[j] = RopeLower(lo, hi, sn[j], cs[j]);  // rope_f64.cuh: NormRopeValue's roundings
    y[j + kH] = RopeUpper(hi, lo, sn[j], cs[j]);
  }
  float* dst = q_out + w * hd + lane;
#pragma unroll
  for (int j = 0; j < kJ; ++j) dst[32 * j] = y[j];
}

// The shapes QueryNormRopeWarpKernel is instantiated for; nullptr for the others.
using WarpKernelFn = void (*)(const float*, int64_t, int64_t, int, int, float, const float*, const double*,
                              const int32_t*, float*);
template <int kJ>
WarpKernelFn WarpKernelForRot(int kh) {
  if constexpr (kJ >= 2) {
    if (kh == kJ / 2) return QueryNormRopeWarpKernel<kJ, kJ / 2>;
  }
  if constexpr (kJ >= 8) {
    if (kh == 3) return QueryNormRopeWarpKernel<kJ, 3>;
  }
  if constexpr (kJ >= 4) {
    if (kh == 2) return QueryNormRopeWarpKernel<kJ, 2>;
    if (kh == 1) return QueryNormRopeWarpKernel<kJ, 1>;
  }
  if (kh == 0) return QueryNormRopeWarpKernel<kJ, 0>;
  return nullptr;
}

WarpKernelFn QueryNormRopeWarpKernelFor(const AttnShape& d) {
  if (d.rot % 64 != 0) return nullptr;  // half a multiple of 32 (rot <= hd is checked before)
  const int kh = d.rot / 64;
  switch (d.hd) {
    case 32: return WarpKernelForRot<1>(kh);
    case 64: return WarpKernelForRot<2>(kh);
    case 128: return WarpKernelForRot<4>(kh);
    case 256: return WarpKernelForRot<8>(kh);
    default: return nullptr;
  }
}

ProcessSwitch g_old_query_rope{[] { return EnvSwitch("TANDEM_OLD_QUERY_ROPE"); }};

// k's and v's token rows are kv_stride floats apart (the cache's: kvh·hd).
__global__ void KvAppendKernel(const float* k, const float* v, int64_t kv_stride, int kvh, int hd, int rot, float eps,
                               const float* k_norm, const double* inv_freq, const int32_t* token_seq,
                               const int32_t* token_pos, PagedKv cache) {
  const int64_t t = blockIdx.x;
  const int g = blockIdx.y;
  const int kvw = kvh * hd;
  // Before the wait: the norm's weight, the rotation and the cache row's offset (the page table is
  // the host's).
  const int64_t pos = token_pos[t];
  const NormRopeConsts kc = NormRopeConstsFor(k_norm, rot, inv_freq, pos);
  const int64_t dst = CacheOffset(cache, token_seq[t], pos, kvw) + static_cast<int64_t>(g) * hd + threadIdx.x;
  PdlWaitForPrevious();  // pdl.cuh: the step's rows only after it; nothing written before
  PdlAllowNext();
  extern __shared__ float pair[];
  __shared__ float scratch[32];
  const int64_t src = t * kv_stride + static_cast<int64_t>(g) * hd + threadIdx.x;
  const float y = NormRopeValue(k[src], kc, eps, hd, rot, pair, scratch);
  cache.k[dst] = y;
  cache.v[dst] = v[src];
}

// QueryNormRopeKernel and KvAppendKernel in one grid: block (t, y) is query head y of token t for
// y < nh, else kv head y - nh (its key normed, roped and stored with its value). The per-head code
// (NormRopeValue, the indexing) is the two kernels' own, so the outputs are bit-identical to
// theirs. Row strides: floats from one token's row to the next in qg (q and gate per head), k and
// v, so that they may be parts of one stacked product's rows.
__global__ void QkvNormRopeAppendKernel(const float* qg, int64_t qg_stride, const float* k, int64_t k_stride,
                                        const float* v, int64_t v_stride, int nh, int kvh, int hd, int rot,
                                        float eps, const float* q_norm, const float* k_norm,
                                        const double* inv_freq, const int32_t* token_seq,
                                        const int32_t* token_pos, float* q_out, PagedKv cache) {
  extern __shared__ float pair[];
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int64_t pos = token_pos[t];
  const bool query = static_cast<int>(blockIdx.y) < nh;  // block-uniform: NormRopeValue's barriers stay whole
  // Before the wait (the two kernels' own order of reads, moved up): the norm's weight, the
  // rotation, and for a kv head its cache row's offset (the page table is the host's).
  const NormRopeConsts kc = NormRopeConstsFor(query ? q_norm : k_norm, rot, inv_freq, pos);
  const int g = static_cast<int>(blockIdx.y) - nh;
  const int kvw = kvh * hd;
  const int64_t col = static_cast<int64_t>(g) * hd + threadIdx.x;
  const int64_t dst = query ? 0 : CacheOffset(cache, token_seq[t], pos, kvw) + col;
  PdlWaitForPrevious();  // pdl.cuh: the step's rows only after it; nothing written before
  PdlAllowNext();
  if (query) {
    const int h = blockIdx.y;
    const float x = qg[t * qg_stride + static_cast<int64_t>(h) * 2 * hd + threadIdx.x];
    const float y = NormRopeValue(x, kc, eps, hd, rot, pair, scratch);
    q_out[(t * nh + h) * hd + threadIdx.x] = y;
    return;
  }
  const float y = NormRopeValue(k[t * k_stride + col], kc, eps, hd, rot, pair, scratch);
  cache.k[dst] = y;
  cache.v[dst] = v[t * v_stride + col];
}

bool NormRopeShapeOk(const AttnShape& d) {
  return d.hd > 0 && d.hd <= 1024 && d.hd % 32 == 0 && d.rot >= 0 && d.rot % 2 == 0 && d.rot <= d.hd;
}

}  // namespace

bool OldQueryRope() { return g_old_query_rope.on(); }
void SetOldQueryRope(bool on) { g_old_query_rope.set(on); }

std::vector<double> RopeInvFrequencies(double theta, int rot) {
  std::vector<double> f(static_cast<size_t>(rot / 2));
  for (int i = 0; i < rot / 2; ++i) f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
  return f;
}

cudaError_t LaunchQueryNormRope(const float* qg, int64_t n, const AttnShape& d, const float* q_norm,
                                const double* inv_freq, const int32_t* token_pos, float* q_out,
                                cudaStream_t stream, int64_t qg_stride) {
  if (n <= 0) return cudaSuccess;
  if (qg_stride == 0) qg_stride = static_cast<int64_t>(d.nh) * 2 * d.hd;
  if (!NormRopeShapeOk(d) || qg_stride < static_cast<int64_t>(d.nh) * 2 * d.hd) return cudaErrorInvalidValue;
  if (WarpKernelFn warp_kernel = QueryNormRopeWarpKernelFor(d); warp_kernel != nullptr && !OldQueryRope()) {
    constexpr int kWarps = 8;  // heads a block
    const int64_t blocks = (n * d.nh + kWarps - 1) / kWarps;
    if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
    return LaunchPdl(warp_kernel, dim3(static_cast<unsigned>(blocks)), dim3(32 * kWarps), 0, stream, qg, qg_stride,
                     n, d.nh, d.hd, d.eps, q_norm, inv_freq, token_pos, q_out);
  }
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(d.nh));
  return LaunchPdl(QueryNormRopeKernel, grid, d.hd, d.hd * sizeof(float), stream, qg, qg_stride, d.nh, d.hd, d.rot,
                   d.eps, q_norm, inv_freq, token_pos, q_out);
}

cudaError_t LaunchKvAppend(const float* k, const float* v, int64_t n, const AttnShape& d,
                           const float* k_norm, const double* inv_freq, const int32_t* token_seq,
                           const int32_t* token_pos, const PagedKv& cache, cudaStream_t stream, int64_t kv_stride) {
  if (n <= 0) return cudaSuccess;
  if (kv_stride == 0) kv_stride = d.kv_width();
  if (!NormRopeShapeOk(d) || kv_stride < d.kv_width()) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(d.kvh));
  return LaunchPdl(KvAppendKernel, grid, d.hd, d.hd * sizeof(float), stream, k, v, kv_stride, d.kvh, d.hd, d.rot, d.eps,
                   k_norm, inv_freq, token_seq, token_pos, cache);
}

cudaError_t LaunchQkvNormRopeAppend(const QkvRows& rows, int64_t n, const AttnShape& d, const float* q_norm,
                                    const float* k_norm, const double* inv_freq, const int32_t* token_seq,
                                    const int32_t* token_pos, float* q_out, const PagedKv& cache,
                                    cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t qg_stride = rows.qg_stride == 0 ? static_cast<int64_t>(d.nh) * 2 * d.hd : rows.qg_stride;
  const int64_t k_stride = rows.k_stride == 0 ? d.kv_width() : rows.k_stride;
  const int64_t v_stride = rows.v_stride == 0 ? d.kv_width() : rows.v_stride;
  if (!NormRopeShapeOk(d) || d.nh <= 0 || d.kvh <= 0 || qg_stride < static_cast<int64_t>(d.nh) * 2 * d.hd ||
      k_stride < d.kv_width() || v_stride < d.kv_width()) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(d.nh + d.kvh));
  return LaunchPdl(QkvNormRopeAppendKernel, grid, d.hd, d.hd * sizeof(float), stream, rows.qg, qg_stride, rows.k,
                   k_stride, rows.v, v_stride, d.nh, d.kvh, d.hd, d.rot, d.eps, q_norm, k_norm, inv_freq, token_seq,
                   token_pos, q_out, cache);
}

}  // namespace tandem::cuda
