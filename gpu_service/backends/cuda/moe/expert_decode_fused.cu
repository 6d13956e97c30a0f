// The one-token MoE layer in one kernel of clusters (expert_decode_fused.cuh says what and why).
//
// Block layout (kFusedWarps = 4 warps). Gate/up: warp w owns rows row0 + 4w .. + 3 of the block's 16,
// a row of h inputs takes nsb = h / 256 lanes (one Q4_K super-block each), as in the two-kernel
// form, so its products and SiLU are the same instructions (q4k_dot.cuh's DotSuperBlockI16). Down:
// thread t owns the block's down rows t, t + 128, ...; per row it reads the slice's 16-byte head
// and 64 qs bytes (two 32-byte groups: sub-blocks 4·half .. 4·half + 3 of super-block s / 2) from
// shared memory, 80 bytes a row, so a warp's 16-byte loads fall on distinct banks.
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"

#include <cooperative_groups.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/moe/block_route.cuh"
#include "gpu_service/backends/cuda/moe/one_token_act.cuh"
#include "gpu_service/backends/cuda/moe/q4k_dot.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/smem_limit.h"

namespace tandem::cuda {
namespace {

namespace cg = cooperative_groups;
using q4k::CpAsync16;
using q4k::Dp2aHi;
using q4k::Dp2aLo;
using q4k::DotSuperBlockI16;
using q4k::I16Inverse;
using q4k::I16Scale;
using q4k::kSbBytes;
using q4k::LoadQ4KHead;
using q4k::Q4KHead;
using q4k::SiluQ4K;
using q4k::SubMin;
using q4k::SubScale;

constexpr int kFusedWarps = 4;
constexpr int kThreads = kFusedWarps * 32;
constexpr int kGateUpRows = kFusedSliceCols / kFusedCluster;  // 16 a block
constexpr int kWarpRows = kGateUpRows / kFusedWarps;          // 4 a warp
constexpr int kDownRowBytes = 80;                              // 16-byte head + 64 qs bytes
constexpr int kSliceWords = kFusedSliceCols / 2;               // the slice's act as int16 pairs

// Cluster barrier halves (PTX barrier.cluster): arrive with release, wait with acquire, so that
// shared-memory writes before a block's arrive are visible to every block of the cluster after its
// wait. Every thread of every block calls both (.aligned).
__device__ __forceinline__ void ClusterArrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void ClusterWait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// Shared-memory carve-up of one block (bytes, each region 16-byte aligned).
struct FusedSmem {
  int gate_up, down, tables, xq, xsc, sxs, act_own, act, total;
};
__host__ __device__ constexpr int Align16(int b) { return (b + 15) / 16 * 16; }
__host__ __device__ inline FusedSmem FusedLayout(int h, int E) {
  const int nsb = h / 256;
  FusedSmem s{};
  int at = 0;
  s.gate_up = at;
  at += Align16(kFusedWarps * 2 * kWarpRows * nsb * kSbBytes);
  s.down = at;
  at += Align16((h / kFusedCluster) * kDownRowBytes);
  s.tables = at;
  at += Align16(3 * E * static_cast<int>(sizeof(void*)));
  s.xq = at;
  at += Align16(nsb * kXqSbStride * 2);
  s.xsc = at;
  at += Align16(nsb * 4);
  s.sxs = at;
  at += Align16(nsb * 8 * 4);
  s.act_own = at;
  at += Align16(kGateUpRows * 4);
  s.act = at;  // the slice's int16 act (kSliceWords words), then its 4 sub-block sums and its scale
  at += Align16(kSliceWords * 4 + 5 * 4);
  s.total = at;
  return s;
}

// grid (inner / 128 · kFusedCluster, K), clusters of kFusedCluster along x, kThreads threads.
// Block (x, k): pick k, slice s = x / 8, cluster rank c = x % 8.
template <int kPer>
__global__ void __launch_bounds__(kThreads) OneTokenFusedKernel(OneTokenMoeArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int s_ids[kOneTokenMaxPicks];
  __shared__ float s_w[kOneTokenMaxPicks];
  const FusedSmem L = FusedLayout(a.h, a.E);
  const int nsb = a.h >> 8;
  const int row_bytes = nsb * kSbBytes;        // a gate/up row
  const int down_row_bytes = (a.inner >> 8) * kSbBytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = threadIdx.x;
  const int k = blockIdx.y;
  const int slice = blockIdx.x / kFusedCluster, rank = blockIdx.x % kFusedCluster;
  const int down_rows = a.h / kFusedCluster;  // this block's output rows: rank · down_rows ..
  uint8_t* wgu = smem + L.gate_up + warp * 2 * kWarpRows * row_bytes;
  uint8_t* wdn = smem + L.down;
  const void** tgate = reinterpret_cast<const void**>(smem + L.tables);
  const void** tup = tgate + a.E;
  const void** tdown = tup + a.E;
  int16_t* xq = reinterpret_cast<int16_t*>(smem + L.xq);
  float* xsc = reinterpret_cast<float*>(smem + L.xsc);
  float* sxs = reinterpret_cast<float*>(smem + L.sxs);
  float* act_own = reinterpret_cast<float*>(smem + L.act_own);
  uint32_t* aw = reinterpret_cast<uint32_t*>(smem + L.act);
  float* a_sum = reinterpret_cast<float*>(aw + kSliceWords);  // 16-byte aligned: read as a float4
  float* a_scale = a_sum + 4;

  // Before the wait: the expert table (constant) and x when its writer is two or more launches
  // back (pdl.cuh's rule).
  for (int i = t; i < a.E; i += kThreads) {
    const ExpertLocation where = a.table[i];
    tgate[i] = where.gate;
    tup[i] = where.up;
    tdown[i] = where.down;
  }
  if (a.x_written_earlier) QuantizeI16(a.x, nsb, xq, xsc, sxs, warp, kFusedWarps, lane);
  PdlWaitForPrevious();  // the router logits (and x, unless written earlier)
  PdlAllowNext();
  if (warp == 0) {
    // Every block needs its pick's weight, hence all K picks.
    WarpPickLogits<kPer>(a.logits, a.E, a.K, s_ids, s_w);
    const float w = PickWeights(s_w, a.K);
    __syncwarp();  // every lane has read s_w
    if (lane < a.K) s_w[lane] = w;
    if (blockIdx.x == 0 && k == a.K - 1 && lane < a.K) {
      const int e = s_ids[lane];
      a.experts_out[lane] = e;
      a.weights_out[lane] = w;
      if (!(e >= 0 && e < a.E && tgate[e] != nullptr)) *a.error = 1;
    }
  } else if (!a.x_written_earlier) {
    QuantizeI16(a.x, nsb, xq, xsc, sxs, warp - 1, kFusedWarps - 1, lane);
  }
  __syncthreads();
  const int e = s_ids[k];
  // A flagged pick computes nothing (uniform over the cluster, which shares k); its blocks still
  // pass both cluster barriers.
  const bool ok = e >= 0 && e < a.E && tgate[e] != nullptr;
  const int row0 = slice * kFusedSliceCols + rank * kGateUpRows + warp * kWarpRows;  // gate/up rows
  const int half = slice & 1, sbi = slice >> 1;  // the slice within its down super-block
  if (ok) {
    // Gate/up rows of this warp first (they gate everything after), then the block's down rows.
    const int chunks = kWarpRows * row_bytes / 16;
    const uint8_t* g = static_cast<const uint8_t*>(tgate[e]) + static_cast<int64_t>(row0) * row_bytes;
    const uint8_t* u = static_cast<const uint8_t*>(tup[e]) + static_cast<int64_t>(row0) * row_bytes;
    const int mat_bytes = kWarpRows * row_bytes;
    for (int c = lane; c < chunks; c += 32) {
      CpAsync16(wgu + 16 * c, g + 16 * c);
      CpAsync16(wgu + mat_bytes + 16 * c, u + 16 * c);
    }
    CpAsyncCommit();
    const uint8_t* d = static_cast<const uint8_t*>(tdown[e]) + static_cast<int64_t>(rank) * down_rows * down_row_bytes +
                       sbi * kSbBytes;
    for (int c = t; c < 5 * down_rows; c += kThreads) {
      const int r = c / 5, part = c - 5 * r;
      const int from = part == 0 ? 0 : 16 + 64 * half + 16 * (part - 1);
      CpAsync16(wdn + r * kDownRowBytes + (part == 0 ? 0 : 16 * part), d + static_cast<int64_t>(r) * down_row_bytes + from);
    }
    CpAsyncCommit();
    CpAsyncWait<1>();  // this thread's gate/up copies
    __syncwarp();      // the warp's rows are visible to all its lanes
    const int rps = 32 / nsb;
    const int rho = lane / nsb, sb = lane - rho * nsb;
    const bool valid = rho < kWarpRows && rho < rps;
    float acc[2][1] = {{0.0f}, {0.0f}};
    if (valid) {
      const uint8_t* wsb[2] = {wgu + rho * row_bytes + sb * kSbBytes, wgu + mat_bytes + rho * row_bytes + sb * kSbBytes};
      DotSuperBlockI16<2>(wsb, xq + sb * kXqSbStride, xsc[sb], sxs + sb * 8, acc);
    }
    for (int off = 1; off < nsb; off <<= 1) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const float o = __shfl_down_sync(0xFFFFFFFFu, acc[m][0], off);
        if (sb + off < nsb) acc[m][0] += o;
      }
    }
    if (valid && sb == 0) act_own[warp * kWarpRows + rho] = SiluQ4K(acc[0][0]) * acc[1][0];
  }
  // Every block's 16 act values are in its shared memory: gather the slice's 128 (warp 0; lane l
  // the four values 4l .. 4l + 3, which sit in rank l / 4) and quantize them to int16 with one
  // scale, keeping the f32 sums of the four sub-blocks of 32 for the min term.
  ClusterArrive();
  ClusterWait();
  if (ok && warp == 0) {
    const cg::cluster_group cluster = cg::this_cluster();
    const float* remote = cluster.map_shared_rank(act_own, lane / 4);
    const float4 v = *reinterpret_cast<const float4*>(remote + 4 * (lane & 3));
    float mx = q4k::MaxAbs4(v);
    float s = (v.x + v.y) + (v.z + v.w);
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
    for (int off = 1; off < 8; off <<= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, off);  // 8 lanes a sub-block
    const float inv = I16Inverse(mx);
    aw[2 * lane] = q4k::PackI16(v.x, v.y, inv);
    aw[2 * lane + 1] = q4k::PackI16(v.z, v.w, inv);
    if ((lane & 7) == 0) a_sum[lane >> 3] = s;
    if (lane == 0) a_scale[0] = I16Scale(mx);
  }
  // This block is done with the other blocks' shared memory; it must not exit before they are done
  // with its own (the wait below, before the end).
  ClusterArrive();
  if (ok) {
    CpAsyncWait<0>();  // the down rows
    __syncthreads();   // every thread's down copies and warp 0's act words
    uint32_t w[kSliceWords];
#pragma unroll
    for (int i = 0; i < kSliceWords / 4; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(aw)[i];
      w[4 * i] = v.x;
      w[4 * i + 1] = v.y;
      w[4 * i + 2] = v.z;
      w[4 * i + 3] = v.w;
    }
    const float ascale = a_scale[0];
    const float4 sums = *reinterpret_cast<const float4*>(a_sum);
    const float wk = s_w[k];
    float gate = 0.0f;  // σ(gate logit) when this block adds the shared term
    const bool add_shared = a.shared != nullptr && k == 0 && slice == 0;
    if (add_shared) gate = a.shared_gate_logit != nullptr ? 1.0f / (1.0f + expf(-a.shared_gate_logit[0])) : 1.0f;
    for (int r = t; r < down_rows; r += kThreads) {
      const uint8_t* row = wdn + r * kDownRowBytes;
      const Q4KHead hd = LoadQ4KHead(row);
      const float dx = hd.d * ascale;
      float acc = 0.0f;
#pragma unroll
      for (int gl = 0; gl < 2; ++gl) {
        // qs bytes of group 2·half + gl: low nibbles are slice columns 64gl + i, high 64gl + 32 + i;
        // act word 32gl + j holds columns 64gl + 2j, + 1 (low half), word 32gl + 16 + j the high.
        const uint4 qa = *reinterpret_cast<const uint4*>(row + 16 + 32 * gl);
        const uint4 qb = *reinterpret_cast<const uint4*>(row + 32 + 32 * gl);
        const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
        int s_lo = 0, s_hi = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t lo = q[j] & 0x0F0F0F0Fu;
          const uint32_t hi = (q[j] >> 4) & 0x0F0F0F0Fu;
          s_lo = Dp2aLo(w[32 * gl + 2 * j], lo, s_lo);
          s_lo = Dp2aHi(w[32 * gl + 2 * j + 1], lo, s_lo);
          s_hi = Dp2aLo(w[32 * gl + 16 + 2 * j], hi, s_hi);
          s_hi = Dp2aHi(w[32 * gl + 16 + 2 * j + 1], hi, s_hi);
        }
        const int j0 = 2 * (2 * half + gl), j1 = j0 + 1;
        const float sum_lo = gl == 0 ? sums.x : sums.z, sum_hi = gl == 0 ? sums.y : sums.w;
        acc = fmaf(dx * SubScale(hd, j0), static_cast<float>(s_lo), acc);
        acc = fmaf(-hd.dmin * SubMin(hd, j0), sum_lo, acc);
        acc = fmaf(dx * SubScale(hd, j1), static_cast<float>(s_hi), acc);
        acc = fmaf(-hd.dmin * SubMin(hd, j1), sum_hi, acc);
      }
      const int j = rank * down_rows + r;
      float add = wk * acc;
      if (add_shared) add = fmaf(gate, a.shared[j], add);
      atomicAdd(a.y + j, add);
    }
  }
  ClusterWait();
}

bool FusedShapeOk(int h, int inner) {
  const int nsb = h / 256;
  return h >= 256 && h % 256 == 0 && (nsb == 1 || nsb == 2 || nsb == 4 || nsb == 8) && inner >= 256 &&
         inner % 256 == 0 && inner / 256 <= 32;
}

constexpr int kMaxSmem = 227 * 1024;

template <int kPer>
cudaError_t LaunchFused(const OneTokenMoeArgs& a, cudaStream_t stream) {
  static std::atomic<size_t> raised{48 * 1024};
  const size_t smem = static_cast<size_t>(FusedLayout(a.h, a.E).total);
  if (const cudaError_t err = RaiseDynamicSmemLimit(OneTokenFusedKernel<kPer>, smem, raised); err != cudaSuccess) {
    return err;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(a.inner / kFusedSliceCols * kFusedCluster), static_cast<unsigned>(a.K));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = kFusedCluster;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[1].val.programmaticStreamSerializationAllowed = PdlEnabled() ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 2;
  return cudaLaunchKernelEx(&config, OneTokenFusedKernel<kPer>, a);
}

}  // namespace

bool OneTokenFusedFits(int E, int K, int h, int inner) {
  return E >= 1 && E <= kOneTokenMaxExperts && K >= 1 && K <= E && K <= kOneTokenMaxPicks && FusedShapeOk(h, inner) &&
         FusedLayout(h, E).total <= kMaxSmem;
}

cudaError_t LaunchOneTokenMoeFused(const OneTokenMoeArgs& a, cudaStream_t stream) {
  if (!OneTokenFusedFits(a.E, a.K, a.h, a.inner) || !a.int16_activations || !a.logit_route || a.logits == nullptr ||
      a.table == nullptr || a.x == nullptr || a.experts_out == nullptr || a.weights_out == nullptr ||
      a.error == nullptr || a.y == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (a.E <= 128) return LaunchFused<4>(a, stream);
  if (a.E <= 256) return LaunchFused<8>(a, stream);
  if (a.E <= 512) return LaunchFused<16>(a, stream);
  return LaunchFused<kOneTokenMaxExperts / 32>(a, stream);
}

}  // namespace tandem::cuda
