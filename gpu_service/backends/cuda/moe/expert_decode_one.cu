// The one-token MoE kernels of expert_decode_one.cuh (what they compute is described there).
//
// Geometry follows the Q4_K tile kernel (expert_decode_q4k.cuh): a lane owns one 144-byte
// super-block of a row, a row of `cols` inputs takes nsb = cols / 256 lanes and a warp step covers
// rps = 32 / nsb rows; the warp copies its rows' raw bytes into shared memory with cp.async and
// decodes from there; activations are staged in shared memory with their sub-block sums.
#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_one_probe.h"

#include <atomic>
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/moe/q4k_dot.cuh"
#include "gpu_service/backends/cuda/moe/route_order.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/smem_limit.h"

namespace tandem::cuda {
namespace {

using q4k::CpAsync16;
using q4k::DotSuperBlock;
using q4k::DotSuperBlockI16;
using q4k::I16Inverse;
using q4k::I16Scale;
using q4k::MaxAbs4;
using q4k::PackI16x8;
using q4k::kSbBytes;
using q4k::kXSbStride;
using q4k::SiluQ4K;

constexpr int kGateUpWarps = 4;  // the tile kernel's measured best at one token (PERF_NOTES.md)
constexpr int kDownMaxWarps = 16;

// Routes the token with the whole block, to the same picks and bit-identical weights as
// device_plan.cu's RouteToken (one warp there): the f64 exponentials are spread over every thread
// (they dominated the one-warp time: 16 a lane, at the f64 rate), then warp 0 sums them in
// RouteToken's order (lane l: experts l, l + 32, ... in turn, then the xor butterfly), scales them
// to f32 probabilities and takes `rounds` picks. A round is two warp reductions (redux.sync)
// instead of WarpTakeFirst's five shuffle steps of (value, id): the probabilities are >= 0, so
// their bits + 1 order them as floats (0 marks a taken, absent or NaN entry), and the lowest id
// holding the largest key wins, RouteBefore's tie-break. Lane 0 writes pick r's expert to ids[r]
// and its probability to probs[r]. Every thread of the block must call it; `overlap` runs in the
// warps other than 0 (in warp 0 when the block is one warp) while warp 0 picks. Returns, in warp 0,
// the f64 sum of the picked probabilities in pick order (the renormaliser once rounds == K).
// A NaN logit is never picked here; RouteToken could pick it or an expert twice (garbage either way).
template <int kPer, typename Overlap, typename Stamp = void (*)(int)>
__device__ double BlockRoute(const float* logits, int E, int rounds, float* s_p, float* s_red, int* ids, float* probs,
                             Overlap&& overlap, Stamp&& stamp = [](int) {}) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
  float mx = -FLT_MAX;
  for (int i = t; i < E; i += blockDim.x) {
    const float v = logits[i];
    s_p[i] = v;
    mx = fmaxf(mx, v);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
  if (lane == 0) s_red[warp] = mx;
  __syncthreads();
  mx = s_red[0];
  for (int w = 1; w < warps; ++w) mx = fmaxf(mx, s_red[w]);  // fmaxf is exact: any order gives RouteToken's max
  stamp(0);
  for (int i = t; i < E; i += blockDim.x) s_p[i] = static_cast<float>(exp(static_cast<double>(s_p[i] - mx)));
  __syncthreads();
  stamp(1);
  double picked_sum = 0.0;
  if (warp == 0) {
    float p[kPer];
    double sum = 0.0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = lane + 32 * j;
      p[j] = i < E ? s_p[i] : 0.0f;
      sum += p[j];
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
    const float inv = static_cast<float>(1.0 / sum);
    stamp(2);
    unsigned key[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const float q = p[j] * inv;
      key[j] = lane + 32 * j < E && !(q != q) ? __float_as_uint(q) + 1u : 0u;
    }
    for (int r = 0; r < rounds; ++r) {
      unsigned best = 0u, best_id = 0xFFFFFFFFu;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (key[j] > best) {  // strictly: the lane's lowest id among equal keys
          best = key[j];
          best_id = lane + 32 * j;
        }
      }
      const unsigned top = __reduce_max_sync(0xFFFFFFFFu, best);
      const unsigned id = __reduce_min_sync(0xFFFFFFFFu, best == top && top != 0u ? best_id : 0xFFFFFFFFu);
      const float bv = top != 0u ? __uint_as_float(top - 1u) : -FLT_MAX;
      if (lane == 0) {
        ids[r] = top != 0u ? static_cast<int>(id) : E;
        probs[r] = bv;
      }
      picked_sum += bv;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (lane + 32 * j == static_cast<int>(id)) key[j] = 0u;
      }
    }
    __syncwarp();  // ids / probs written by lane 0
  }
  if (warp != 0 || warps == 1) overlap();
  __syncthreads();
  return picked_sum;
}

// expert_decode_one_probe.h's state and stamps (compiled into the kProbe instantiations only).
struct ProbeState {
  unsigned long long* stamps;
  unsigned capacity;
  unsigned count[2];
  unsigned down_late;
};
__device__ ProbeState g_probe;

template <bool kProbe>
struct PhaseProbe {
  unsigned long long* row = nullptr;
  __device__ explicit PhaseProbe(int kernel) {
    if constexpr (kProbe) {
      if (threadIdx.x == 0) {
        const unsigned slot = atomicAdd(&g_probe.count[kernel], 1u);
        if (g_probe.stamps != nullptr && slot < g_probe.capacity) {
          row = g_probe.stamps + (static_cast<unsigned long long>(kernel) * g_probe.capacity + slot) * kOneTokenProbeWords;
          unsigned smid;
          asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
          row[kOneTokenProbeWords - 2] = smid;
          row[kOneTokenProbeWords - 1] = blockIdx.x + blockIdx.y * gridDim.x;
          Stamp(0);
        }
      }
    }
  }
  __device__ void Stamp(int phase) const {
    if constexpr (kProbe) {
      if (row != nullptr) row[phase] = GlobalTimerNs();
    }
  }
};

// Whether pick e names a computable expert (the plan's test: in [0, E) with a location).
__device__ __forceinline__ bool PickValid(const ExpertLocation* table, int E, int e) {
  return e >= 0 && e < E && table[e].gate != nullptr;
}

// Stages `cols` activations from global `src` into xs (super-blocks padded to kXSbStride) with
// threads [t0, t0 + nt) of the block.
__device__ __forceinline__ void StageRow(const float* src, int cols, float* xs, int t, int t0, int nt) {
  const float4* xr = reinterpret_cast<const float4*>(src);
  for (int qd = t - t0; qd < (cols >> 2); qd += nt) {
    const int e = 4 * qd;
    *reinterpret_cast<float4*>(xs + (e >> 8) * kXSbStride + (e & 255)) = xr[qd];
  }
}

// Sub-block sums of a staged row (the tile kernel's order): sxs[sb · 8 + j] for nsb super-blocks.
__device__ __forceinline__ void SubBlockSums(const float* xs, int nsb, float* sxs, int t, int nt) {
  for (int i = t; i < nsb * 8; i += nt) sxs[i] = q4k::StagedSubBlockSum(xs, i);
}

// int16 activations in shared memory: super-block sb at xq + kXqSbStride·sb. The padding keeps the
// lanes of one row (one super-block each, reading at the same offset) on distinct banks, as
// kXSbStride does for f32 (256 int16 would put all eight 512 bytes apart: an 8-way conflict).
constexpr int kXqSbStride = 264;

// int16 activations (q4k_dot.cuh's DotSuperBlockI16): a row of nsb super-blocks (super-block sb
// at src + stride·sb: global memory, 256, or a staged copy, kXSbStride) quantized per super-block
// into xq[kXqSbStride·sb + i] and xsc[sb], with its f32 sub-block sums sxs[8·sb + j]. Warp w of
// nw takes super-blocks w, w + nw, ...; lane l eight elements.
__device__ __forceinline__ void QuantizeI16(const float* src, int stride, int nsb, int16_t* xq, float* xsc, float* sxs,
                                            int w, int nw, int lane) {
  for (int sb = w; sb < nsb; sb += nw) {
    const float4* p = reinterpret_cast<const float4*>(src + sb * stride + 8 * lane);
    const float4 u = p[0], v = p[1];
    float mx = fmaxf(MaxAbs4(u), MaxAbs4(v));
    float s = ((u.x + u.y) + (u.z + u.w)) + ((v.x + v.y) + (v.z + v.w));
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);  // four lanes hold a sub-block of 32
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 2);
    *reinterpret_cast<uint4*>(xq + sb * kXqSbStride + 8 * lane) = PackI16x8(u, v, I16Inverse(mx));
    if ((lane & 3) == 0) sxs[sb * 8 + (lane >> 2)] = s;
    if (lane == 0) xsc[sb] = I16Scale(mx);
  }
}

// int16 activations, one warp: `cols` f32 activations read from global src, quantized per
// super-block into xq / xsc with their f32 sub-block sums sxs (as QuantizeI16). Lane l
// takes 16 elements of each 512.
__device__ __forceinline__ void StageQuantizeI16(const float* src, int cols, int16_t* xq, float* xsc, float* sxs,
                                                 int lane) {
  for (int c0 = 0; c0 < cols; c0 += 512) {
    const int c = c0 + 16 * lane;
    const bool in = c < cols;  // cols is a multiple of 256: a half-warp is in or out
    float4 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = in ? reinterpret_cast<const float4*>(src + c)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    float mx = 0.0f, s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      mx = fmaxf(mx, MaxAbs4(v[i]));
      s += (v[i].x + v[i].y) + (v[i].z + v[i].w);
    }
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);  // two lanes hold a sub-block of 32
    for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));  // 16 a super-block
    if (in) {
      const float inv = I16Inverse(mx);
      uint4* dst = reinterpret_cast<uint4*>(xq + (c >> 8) * kXqSbStride + (c & 255));
      dst[0] = PackI16x8(v[0], v[1], inv);
      dst[1] = PackI16x8(v[2], v[3], inv);
      if ((lane & 1) == 0) sxs[c >> 5] = s;
      if ((lane & 15) == 0) xsc[c >> 8] = I16Scale(mx);
    }
  }
}

// Kernel 1. grid (ceil(inner / (kGateUpWarps · rps)), K), kGateUpWarps warps. Shared memory:
// [weights: warp, matrix (gate, up), rps rows][x: nsb padded super-blocks][Σx: nsb × 8]
// [gate pointers: E][up pointers: E]; with kI16 no f32 x (x is quantized straight from global
// memory: ~8 KB less a block at the 80B shape, so that a down block fits beside three gate/up
// blocks and enters early) and after the pointers [x as int16: nsb × kXqSbStride][x scales: nsb].
template <int kPer, bool kProbe = false, bool kI16 = false>
__global__ void __launch_bounds__(kGateUpWarps * 32) OneGateUpKernel(OneTokenMoeArgs a) {
  const PhaseProbe<kProbe> probe(0);
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float s_p[kPer * 32];
  __shared__ float s_red[kGateUpWarps];
  __shared__ int s_ids[kOneTokenMaxPicks];
  __shared__ float s_probs[kOneTokenMaxPicks];
  const int nsb = a.h >> 8;
  const int row_bytes = nsb * kSbBytes;
  const int rps = 32 / nsb;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rho = lane / nsb, sb = lane - rho * nsb;
  const int mat_bytes = rps * row_bytes;
  uint8_t* wsm = smem + warp * 2 * mat_bytes;
  float* xs = reinterpret_cast<float*>(smem + kGateUpWarps * 2 * mat_bytes);  // f32 only
  float* sxs = xs + (kI16 ? 0 : nsb * kXSbStride);
  const void** tgate = reinterpret_cast<const void**>(sxs + nsb * 8);
  const void** tup = tgate + a.E;
  [[maybe_unused]] int16_t* xq = reinterpret_cast<int16_t*>(tup + a.E);  // kI16 only
  [[maybe_unused]] float* xsc = reinterpret_cast<float*>(xq + nsb * kXqSbStride);
  const int k = blockIdx.y;
  const int row0 = (blockIdx.x * kGateUpWarps + warp) * rps;

  // Before the wait: the expert table's gate and up pointers (constant), so that the pick's
  // matrices are known from shared memory as soon as it is made.
  for (int i = threadIdx.x; i < a.E; i += kGateUpWarps * 32) {
    tgate[i] = a.table[i].gate;
    tup[i] = a.table[i].up;
  }
  // The logits are the previous kernel's output; x is read after the wait too (pdl.cuh's rule).
  PdlWaitForPrevious();
  probe.Stamp(1);
  PdlAllowNext();
  // With kI16 no f32 copy: x is quantized straight from global memory during the routing below.
  if constexpr (!kI16) StageRow(a.x, a.h, xs, threadIdx.x, 0, kGateUpWarps * 32);
  // Block (0, K - 1) routes all K picks anyway: it publishes them for the routing sink, the host
  // copy and the tests. The others stop at their own pick.
  const bool writer = blockIdx.x == 0 && k == a.K - 1;
  const double picked_sum = BlockRoute<kPer>(
      a.logits, a.E, k + 1, s_p, s_red, s_ids, s_probs,
      [&] {
        if constexpr (kI16) {
          QuantizeI16(a.x, 256, nsb, xq, xsc, sxs, warp - 1, kGateUpWarps - 1, lane);
        } else {
          SubBlockSums(xs, nsb, sxs, threadIdx.x - 32, (kGateUpWarps - 1) * 32);
        }
      },
      [&](int sub) { probe.Stamp(5 + sub); });
  probe.Stamp(2);
  if (writer && warp == 0 && lane < a.K) {
    const int e = s_ids[lane];
    a.experts_out[lane] = e;
    a.weights_out[lane] = static_cast<float>(s_probs[lane] / picked_sum);
    if (!(e >= 0 && e < a.E && tgate[e] != nullptr)) *a.error = 1;
  }
  const int e = s_ids[k];
  if (!(e >= 0 && e < a.E && tgate[e] != nullptr)) return;  // uniform over the block; flagged by the writer
  const int nrows = min(rps, a.inner - row0);
  const int chunks = nrows > 0 ? nrows * row_bytes / 16 : 0;
  const uint8_t* g = static_cast<const uint8_t*>(tgate[e]) + static_cast<int64_t>(row0) * row_bytes;
  const uint8_t* u = static_cast<const uint8_t*>(tup[e]) + static_cast<int64_t>(row0) * row_bytes;
  for (int c = lane; c < chunks; c += 32) {
    CpAsync16(wsm + 16 * c, g + 16 * c);
    CpAsync16(wsm + mat_bytes + 16 * c, u + 16 * c);
  }
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncwarp();  // the other lanes' copies are visible
  probe.Stamp(3);
  if (nrows <= 0) return;  // warp-uniform
  const int row = row0 + rho;
  const bool valid = rho < rps && rho < nrows;
  float acc[2][1] = {{0.0f}, {0.0f}};
  if (valid) {
    const uint8_t* wsb[2] = {wsm + rho * row_bytes + sb * kSbBytes, wsm + mat_bytes + rho * row_bytes + sb * kSbBytes};
    if constexpr (kI16) {
      DotSuperBlockI16<2>(wsb, xq + sb * kXqSbStride, xsc[sb], sxs + sb * 8, acc);
    } else {
      DotSuperBlock<1, 2>(wsb, xs + sb * kXSbStride, 0, sxs + sb * 8, 0, 1, acc);
    }
  }
  for (int off = 1; off < nsb; off <<= 1) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const float o = __shfl_down_sync(0xFFFFFFFFu, acc[m][0], off);
      if (sb + off < nsb) acc[m][0] += o;
    }
  }
  if (valid && sb == 0) a.act[static_cast<int64_t>(k) * a.inner + row] = SiluQ4K(acc[0][0]) * acc[1][0];
  probe.Stamp(4);
}

// Bytes of a down warp's act region: nsb padded f32 super-blocks, or with int16 activations nsb
// padded int16 super-blocks and their scales (half as much: with the f32 form's region a down block
// did not fit beside three int16 gate/up blocks), a multiple of 16.
__host__ __device__ constexpr int DownActBytes(int nsb, bool i16) {
  return i16 ? (nsb * (kXqSbStride * 2 + 4) + 15) / 16 * 16 : nsb * kXSbStride * 4;
}

// Kernel 2. grid ceil(h / rps) (rps for the inner-wide rows), W = min(K, kDownMaxWarps) warps;
// warp w computes picks w, w + W, ... Shared memory: [weights: K picks × rps rows][act: W warps ×
// nsb padded super-blocks][Σact: W × nsb × 8][results: K × rps]; with kI16 a warp's act region
// holds its int16 act (nsb × kXqSbStride) and their scales (nsb) instead.
template <int kPer, bool kProbe = false, bool kI16 = false>
__global__ void __launch_bounds__(kDownMaxWarps * 32) OneDownKernel(OneTokenMoeArgs a) {
  const PhaseProbe<kProbe> probe(1);
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float s_p[kPer * 32];
  __shared__ float s_red[kDownMaxWarps];
  __shared__ int s_ids[kOneTokenMaxPicks];
  __shared__ float s_w[kOneTokenMaxPicks];
  __shared__ bool s_ok[kOneTokenMaxPicks];
  const int nsb = a.inner >> 8;
  const int row_bytes = nsb * kSbBytes;
  const int rps = 32 / nsb;
  const int W = blockDim.x >> 5;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rho = lane / nsb, sb = lane - rho * nsb;
  const int mat_bytes = rps * row_bytes;
  const int xr = DownActBytes(nsb, kI16);  // a warp's act region
  float* xs = reinterpret_cast<float*>(smem + a.K * mat_bytes + warp * xr);
  float* sxs = reinterpret_cast<float*>(smem + a.K * mat_bytes + W * xr) + warp * nsb * 8;
  float* res = reinterpret_cast<float*>(smem + a.K * mat_bytes + W * xr) + W * nsb * 8;
  const int row0 = blockIdx.x * rps;
  const int nrows = min(rps, a.h - row0);

  // Before the wait: routing from the logits (complete before kernel 1 passed its own wait and
  // let this grid start) and the copies of the down rows (constant weights).
  auto route_and_copy = [&] {
    const double picked_sum =
        BlockRoute<kPer>(a.logits, a.E, a.K, s_p, s_red, s_ids, s_w, [] {}, [&](int sub) { probe.Stamp(8 + sub); });
    if (warp == 0 && lane < a.K) {
      s_w[lane] = static_cast<float>(s_w[lane] / picked_sum);
      s_ok[lane] = PickValid(a.table, a.E, s_ids[lane]);
    }
    __syncthreads();
    for (int k = warp; k < a.K; k += W) {
      if (!s_ok[k]) continue;
      const uint8_t* src = static_cast<const uint8_t*>(a.table[s_ids[k]].down) + static_cast<int64_t>(row0) * row_bytes;
      uint8_t* dst = smem + k * mat_bytes;
      const int chunks = nrows * row_bytes / 16;
      for (int c = lane; c < chunks; c += 32) CpAsync16(dst + 16 * c, src + 16 * c);
    }
    CpAsyncCommit();
    probe.Stamp(1);
  };
  // The probe's A/B (SetOneTokenProbe's down_late): routing and copies after the wait instead.
  bool late = false;
  if constexpr (kProbe) late = g_probe.down_late != 0;
  if (!late) route_and_copy();

  PdlWaitForPrevious();  // act (kernel 1), shared and its gate logit are read from here on
  probe.Stamp(2);
  PdlAllowNext();
  if (late) route_and_copy();
  CpAsyncWait<0>();
  __syncwarp();
  probe.Stamp(3);
  for (int k = warp; k < a.K; k += W) {
    if (!s_ok[k]) continue;  // warp-uniform
    [[maybe_unused]] int16_t* xq = reinterpret_cast<int16_t*>(xs);
    [[maybe_unused]] float* xsc = reinterpret_cast<float*>(xq + nsb * kXqSbStride);
    if constexpr (kI16) {
      StageQuantizeI16(a.act + static_cast<int64_t>(k) * a.inner, a.inner, xq, xsc, sxs, lane);
      __syncwarp();
      if (k == 0) probe.Stamp(11);
    } else {
      StageRow(a.act + static_cast<int64_t>(k) * a.inner, a.inner, xs, lane, 0, 32);
      __syncwarp();
      if (k == 0) probe.Stamp(11);
      SubBlockSums(xs, nsb, sxs, lane, 32);
    }
    __syncwarp();
    if (k == 0) probe.Stamp(12);
    const bool valid = rho < rps && rho < nrows;
    float acc[1][1] = {{0.0f}};
    if (valid) {
      const uint8_t* wsb[1] = {smem + k * mat_bytes + rho * row_bytes + sb * kSbBytes};
      if constexpr (kI16) {
        DotSuperBlockI16<1>(wsb, xq + sb * kXqSbStride, xsc[sb], sxs + sb * 8, acc);
      } else {
        DotSuperBlock<1, 1>(wsb, xs + sb * kXSbStride, 0, sxs + sb * 8, 0, 1, acc);
      }
    }
    for (int off = 1; off < nsb; off <<= 1) {
      const float o = __shfl_down_sync(0xFFFFFFFFu, acc[0][0], off);
      if (sb + off < nsb) acc[0][0] += o;
    }
    if (valid && sb == 0) res[k * rps + rho] = acc[0][0];
    __syncwarp();  // xs and sxs are restaged for the warp's next pick
    if (k == 0) probe.Stamp(13);
  }
  __syncthreads();
  probe.Stamp(4);
  const int t = threadIdx.x;
  if (t < nrows) {
    // moe_scatter.cu's sum: picks in order, then the shared term.
    float acc = 0.0f;
    for (int k = 0; k < a.K; ++k) {
      if (s_ok[k]) acc = fmaf(s_w[k], res[k * rps + t], acc);
    }
    if (a.shared != nullptr) {
      float g = 1.0f;
      if (a.shared_gate_logit != nullptr) g = 1.0f / (1.0f + expf(-a.shared_gate_logit[0]));
      acc = fmaf(g, a.shared[row0 + t], acc);
    }
    a.y[row0 + t] = acc;
  }
  probe.Stamp(5);
}

size_t GateUpSmem(int h, int E, bool i16) {
  const int nsb = h / 256, rps = 32 / nsb;
  return static_cast<size_t>(kGateUpWarps) * 2 * rps * nsb * kSbBytes +
         static_cast<size_t>(nsb) * ((i16 ? 0 : kXSbStride) + 8) * 4 + static_cast<size_t>(E) * 2 * sizeof(void*) +
         (i16 ? static_cast<size_t>(nsb) * (kXqSbStride * 2 + 4) : 0);
}

int DownWarps(int K) { return K < kDownMaxWarps ? K : kDownMaxWarps; }

size_t DownSmem(int K, int inner, bool i16) {
  const int nsb = inner / 256, rps = 32 / nsb;
  return static_cast<size_t>(K) * rps * nsb * kSbBytes +
         static_cast<size_t>(DownWarps(K)) * (DownActBytes(nsb, i16) + nsb * 8 * 4) + static_cast<size_t>(K) * rps * 4;
}

constexpr size_t kMaxSmem = 227 * 1024;

bool Tiles(int cols) { return cols >= 256 && cols % 256 == 0 && cols / 256 <= 32; }

template <int kPer, bool kProbe = false, bool kI16 = false>
cudaError_t LaunchGateUp(const OneTokenMoeArgs& a, cudaStream_t stream) {
  static std::atomic<size_t> raised{48 * 1024};
  const size_t smem = GateUpSmem(a.h, a.E, kI16);
  if (const cudaError_t err = RaiseDynamicSmemLimit(OneGateUpKernel<kPer, kProbe, kI16>, smem, raised); err != cudaSuccess) {
    return err;
  }
  const int rows_per_block = kGateUpWarps * (32 / (a.h / 256));
  const dim3 grid(static_cast<unsigned>((a.inner + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(a.K));
  return LaunchPdl(OneGateUpKernel<kPer, kProbe, kI16>, grid, dim3(kGateUpWarps * 32), smem, stream, a);
}

template <int kPer, bool kProbe = false, bool kI16 = false>
cudaError_t LaunchDown(const OneTokenMoeArgs& a, cudaStream_t stream) {
  static std::atomic<size_t> raised{48 * 1024};
  const size_t smem = DownSmem(a.K, a.inner, kI16);
  if (const cudaError_t err = RaiseDynamicSmemLimit(OneDownKernel<kPer, kProbe, kI16>, smem, raised); err != cudaSuccess) {
    return err;
  }
  const int rps = 32 / (a.inner / 256);
  return LaunchPdl(OneDownKernel<kPer, kProbe, kI16>, dim3(static_cast<unsigned>((a.h + rps - 1) / rps)),
                   dim3(32 * DownWarps(a.K)), smem, stream, a);
}

bool ArgsOk(const OneTokenMoeArgs& a) {
  return OneTokenMoeFits(a.E, a.K, a.h, a.inner) && a.logits != nullptr && a.table != nullptr && a.x != nullptr &&
         a.act != nullptr && a.experts_out != nullptr && a.weights_out != nullptr && a.error != nullptr &&
         a.y != nullptr;
}

// Registers per lane for E logits: the route kernels' buckets.
template <typename F>
cudaError_t DispatchPer(int E, F&& f) {
  if (E <= 128) return f(std::integral_constant<int, 4>{});
  if (E <= 256) return f(std::integral_constant<int, 8>{});
  if (E <= 512) return f(std::integral_constant<int, 16>{});
  return f(std::integral_constant<int, kOneTokenMaxExperts / 32>{});
}

}  // namespace

bool OneTokenMoeFits(int E, int K, int h, int inner) {
  return E >= 1 && E <= kOneTokenMaxExperts && K >= 1 && K <= E && K <= kOneTokenMaxPicks && Tiles(h) &&
         Tiles(inner) && GateUpSmem(h, E, false) <= kMaxSmem && GateUpSmem(h, E, true) <= kMaxSmem &&
         DownSmem(K, inner, false) <= kMaxSmem;
}

cudaError_t LaunchOneTokenMoeGateUp(const OneTokenMoeArgs& a, cudaStream_t stream) {
  if (!ArgsOk(a)) return cudaErrorInvalidValue;
  return DispatchPer(a.E, [&](auto per) {
    return a.int16_activations ? LaunchGateUp<decltype(per)::value, false, true>(a, stream)
                               : LaunchGateUp<decltype(per)::value>(a, stream);
  });
}

cudaError_t LaunchOneTokenMoeDown(const OneTokenMoeArgs& a, cudaStream_t stream) {
  if (!ArgsOk(a)) return cudaErrorInvalidValue;
  return DispatchPer(a.E, [&](auto per) {
    return a.int16_activations ? LaunchDown<decltype(per)::value, false, true>(a, stream)
                               : LaunchDown<decltype(per)::value>(a, stream);
  });
}

cudaError_t SetOneTokenProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream, bool down_late) {
  const ProbeState state{stamps, capacity, {0u, 0u}, down_late ? 1u : 0u};
  return cudaMemcpyToSymbolAsync(g_probe, &state, sizeof(state), 0, cudaMemcpyHostToDevice, stream);
}

cudaError_t LaunchOneTokenMoeGateUpProbed(const OneTokenMoeArgs& a, cudaStream_t stream) {
  if (!ArgsOk(a)) return cudaErrorInvalidValue;
  if (a.E <= 256 || a.E > 512) return cudaErrorNotSupported;
  return a.int16_activations ? LaunchGateUp<16, true, true>(a, stream) : LaunchGateUp<16, true>(a, stream);
}

cudaError_t LaunchOneTokenMoeDownProbed(const OneTokenMoeArgs& a, cudaStream_t stream) {
  if (!ArgsOk(a)) return cudaErrorInvalidValue;
  if (a.E <= 256 || a.E > 512) return cudaErrorNotSupported;
  return a.int16_activations ? LaunchDown<16, true, true>(a, stream) : LaunchDown<16, true>(a, stream);
}

}  // namespace tandem::cuda
