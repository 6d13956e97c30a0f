// OneTokenFusedKernel: the one-token MoE layer in one kernel of clusters (expert_decode_fused.cuh
// says what and why); its launches are in expert_decode_fused.cu, the one file that includes this,
// and its definitions sit in an anonymous namespace (the probe's stamps and buffer in
// expert_decode_fused_stamps.cuh).
//
// Block layout (kFusedWarps = 4 warps). Gate/up: warp w owns rows row0 + 4w .. + 3 of the block's 16,
// a row of h inputs takes nsb = h / 256 lanes (one Q4_K super-block each), as in the two-kernel
// form, so its products and SiLU are the same instructions (q4k_dot.cuh's DotSuperBlockI16). Down:
// thread t owns the block's down rows t, t + 128, ...; per row it reads the slice's 16-byte head
// and 64 qs bytes (two 32-byte groups: sub-blocks 4·half .. 4·half + 3 of super-block s / 2) from
// shared memory, 80 bytes a row, so a warp's 16-byte loads fall on distinct banks. The routed down
// rows are copied into the gate/up rows' shared memory once the gate/up products are done
// (FusedSmem says why), as the shared expert's are.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_KERNEL_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_KERNEL_CUH_

#include <cstdint>
#include <type_traits>

#include "gpu_service/backends/cuda/cluster_barrier.cuh"
#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/mbarrier.cuh"
#include "gpu_service/backends/cuda/moe/block_route.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused_probe.h"
#include "gpu_service/backends/cuda/moe/expert_decode_fused_stamps.cuh"
#include "gpu_service/backends/cuda/moe/fused_router.cuh"
#include "gpu_service/backends/cuda/moe/one_token_act.cuh"
#include "gpu_service/backends/cuda/moe/q4k_dot.cuh"
#include "gpu_service/backends/cuda/moe/warp_slot.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

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
constexpr int kSharedWarpRows = kFusedSharedSliceCols / kFusedCluster / kFusedWarps;  // 2 a warp
constexpr int kSharedDownSpan = 96;  // 16-byte pieces covering a shared down row's 68 bytes

// Shared-memory carve-up of one block (bytes, each region 16-byte aligned). One weight region holds
// first the gate/up rows, then the down rows (copied once the gate/up products are done), of a
// routed slice or, in the shared expert's blocks, its Q8_0 rows (2 gate/up rows a warp of
// h / 32 · 34 bytes; h / 8 down rows of 68 bytes, copied as the 96-byte span of 16-byte pieces
// around them). Sharing the region keeps a block near 55 KB at the 80B shapes, so four fit an SM:
// the grid's 48 clusters of 8 (routed and shared) then fit the GPU in one wave with room to spare,
// where at three an SM they did not (PERF.md).
struct FusedSmem {
  int weights, tables, xq, xsc, sxs, act_all, act_bar, act, total;
};
__host__ __device__ constexpr int Align16(int b) { return (b + 15) / 16 * 16; }
__host__ __device__ constexpr int Q8RowBytes(int cols) { return cols / 32 * 34; }
__host__ __device__ inline FusedSmem FusedLayout(int h, int E) {
  const int nsb = h / 256;
  const int gate_up = kFusedWarps * 2 * kWarpRows * nsb * kSbBytes;
  const int gate_up_q8 = kFusedWarps * 2 * kSharedWarpRows * Q8RowBytes(h);
  const int down = (h / kFusedCluster) * kSharedDownSpan;  // >= kDownRowBytes a routed row
  int weights = gate_up > gate_up_q8 ? gate_up : gate_up_q8;
  weights = weights > down ? weights : down;
  FusedSmem s{};
  int at = 0;
  s.weights = at;
  at += Align16(weights);
  s.tables = at;
  at += Align16(3 * E * static_cast<int>(sizeof(void*)));
  s.xq = at;
  at += Align16(nsb * kXqSbStride * 2);
  s.xsc = at;
  at += Align16(nsb * 4);
  s.sxs = at;
  at += Align16(nsb * 8 * 4);
  s.act_all = at;  // the slice's act values, pushed by the cluster's blocks (st.async)
  at += Align16(kFusedSliceCols * 4);
  s.act_bar = at;  // the mbarrier their pushes complete
  at += 16;
  s.act = at;  // the slice's int16 act (up to kSliceWords words), then its 4 sub-block sums and its scale
  at += Align16(kSliceWords * 4 + 5 * 4);
  s.total = at;
  return s;
}

// Σ over n Q8_0 blocks (34 bytes: f16 d, 32 int8) at w of d·Σ q·xq, xq the int16 activations as
// pairs (word i: elements 2i, 2i + 1); the int8 pairs are read as 16-bit words (the blocks are only
// 2-byte aligned), each the low half of one dp2a.
__device__ __forceinline__ float DotQ8Blocks(const uint8_t* w, const uint32_t* xq, int n) {
  float acc = 0.0f;
  for (int b = 0; b < n; ++b) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(w + 34 * b);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) s = Dp2aLo(xq[16 * b + i], p[1 + i], s);
    acc = fmaf(HalfBits(p[0]), static_cast<float>(s), acc);
  }
  return acc;
}

static_assert(kFusedRouterWarps == kFusedWarps, "fused_router.cuh's blocks are the grid's");

// grid (kFusedCluster · (K · inner / 128 + shared_inner / 64)), clusters of kFusedCluster along x,
// kThreads threads. Block b < K · inner / 128 · 8: pick k = b / (inner / 128 · 8), slice s = (b / 8)
// mod (inner / 128), cluster rank c = b mod 8. The rest: the shared expert's slices of 64 columns.
// kRouter (FusedRouter given): the grid starts with rt.blocks router blocks (fused_router.cuh)
// and blockIdx.x counts from after them below. A template parameter rather than a test of rt.w, so
// that the form without router blocks keeps the code measured before they existed. kProbe
// (expert_decode_fused_probe.h): the phase stamps into `probe`, with a block barrier before the
// "summed" stamp; the other instantiations ignore `probe`. kLean (with kRouter, without kProbe;
// expert_decode_fused.cuh's MoeLean): 1, the fast decode defaults compiled in as constants (x
// written by the launch just before, warp 0 picks, no shared term given in y's form, the router
// rows preloaded), so that their alternatives' code is not in the kernel; 2, also the 80B's shapes
// (h kMoeLeanHidden, inner and the shared expert's inner kMoeLeanInner). The launch takes it only
// where those are the arguments.
template <int kPer, bool kRouter, bool kProbe, int kLean = 0>
__global__ void __launch_bounds__(kThreads)
    OneTokenFusedKernel(OneTokenMoeArgs a, FusedSharedExpert sh, FusedRouter rt, unsigned long long* probe) {
  static_assert(kLean == 0 || (kRouter && !kProbe), "the lean forms are the router-in-grid one's, unstamped");
  if constexpr (kLean >= 1) {
    a.x_written_earlier = false;
    a.pick_warp_by_slot = false;
    a.shared = nullptr;
    rt.preload = true;
  }
  if constexpr (kLean >= 2) {
    a.h = kMoeLeanHidden;
    a.inner = sh.inner = kMoeLeanInner;
  }
  if (kRouter && static_cast<int>(blockIdx.x) < rt.blocks) {
    const FusedStamps<kProbe> stamps(probe, kFusedProbeRouterKind, -1);
    RouterBlock(a, rt);
    stamps.Stamp(kFusedProbeExit);
    return;
  }
  const int block = static_cast<int>(blockIdx.x) - (kRouter ? rt.blocks : 0);
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int s_ids[kOneTokenMaxPicks];
  __shared__ float s_w[kOneTokenMaxPicks];
  const FusedSmem L = FusedLayout(a.h, a.E);
  const int nsb = a.h >> 8;
  const int row_bytes = nsb * kSbBytes;        // a gate/up row
  const int down_row_bytes = (a.inner >> 8) * kSbBytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = threadIdx.x;
  const int per_pick = a.inner / kFusedSliceCols * kFusedCluster;
  const bool shared_block = block >= a.K * per_pick;
  const int local = shared_block ? block - a.K * per_pick : block % per_pick;
  const int k = shared_block ? a.K : block / per_pick;
  const int slice = local / kFusedCluster, rank = local % kFusedCluster;
  const int down_rows = a.h / kFusedCluster;  // this block's output rows: rank · down_rows ..
  const FusedStamps<kProbe> stamps(probe, shared_block ? kFusedProbeSharedKind : kFusedProbeRoutedKind,
                                    shared_block ? -1 : k);
  uint8_t* wgu = smem + L.weights;
  uint8_t* wdn = smem + L.weights;  // the same region, once the gate/up products are done
  const void** tgate = reinterpret_cast<const void**>(smem + L.tables);
  const void** tup = tgate + a.E;
  const void** tdown = tup + a.E;
  int16_t* xq = reinterpret_cast<int16_t*>(smem + L.xq);
  float* xsc = reinterpret_cast<float*>(smem + L.xsc);
  float* sxs = reinterpret_cast<float*>(smem + L.sxs);
  const float* act_all = reinterpret_cast<const float*>(smem + L.act_all);
  const uint32_t act_all_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem + L.act_all));
  const uint32_t act_bar = static_cast<uint32_t>(__cvta_generic_to_shared(smem + L.act_bar));
  uint32_t* aw = reinterpret_cast<uint32_t*>(smem + L.act);
  float* a_sum = reinterpret_cast<float*>(aw + kSliceWords);  // 16-byte aligned: read as a float4
  float* a_scale = a_sum + 4;

  const int slice_cols = shared_block ? kFusedSharedSliceCols : kFusedSliceCols;
  // The slice's act values reach every block of the cluster as st.async pushes into act_all, each
  // counted against this block's act_bar (mbarrier.cuh's StoreAsyncToCluster), instead of a
  // cluster barrier with release semantics and reads of the other blocks' shared memory: the
  // release compiles to a GPU-scope MEMBAR (docs/PERF.md, forty-eighth session). The barrier expects
  // the slice's bytes; every block's barrier is initialised before any block pushes (the relaxed
  // cluster barrier after the init fence), all of it before the PDL wait.
  mbarrier::InitForClusterPushes(act_bar, static_cast<uint32_t>(slice_cols * 4), t == 0);
  // The slice's act value at position p of the slice, into every block of the cluster.
  auto push_act = [&](float v, int p) {
    mbarrier::StoreAsyncToEveryBlock<kFusedCluster>(act_all_addr + 4u * static_cast<uint32_t>(p), v, act_bar);
  };
  // Before the wait: the expert table (constant) and x when its writer is two or more launches
  // back (pdl.cuh's rule).
  if (!shared_block) {
    for (int i = t; i < a.E; i += kThreads) {
      const ExpertLocation where = a.table[i];
      tgate[i] = where.gate;
      tup[i] = where.up;
      tdown[i] = where.down;
    }
  }
  if (a.x_written_earlier) QuantizeI16(a.x, nsb, xq, xsc, sxs, warp, kFusedWarps, lane);
  // The warp that routes and gathers the slice's act (OneTokenMoeArgs::pick_warp_by_slot): warp 0,
  // or the one warp_slot.cuh's PickWarpOfSlot names. The probe's stamps are thread 0's, so its
  // instantiation keeps warp 0.
  int picker = 0;
  if (!kProbe && a.pick_warp_by_slot) {
    __shared__ int s_picker;
    if (t == 0) s_picker = PickWarpOfSlot(WarpSlot(), kFusedWarps);
    __syncthreads();
    picker = s_picker;
  }
  // The router logits and the shared gate logit (or, with the router in the grid, x's writer; the
  // logits then come from the router blocks), and x unless written earlier.
  PdlWaitForPrevious();
  PdlAllowNext();
  stamps.Stamp(kFusedProbeAfterWait);
  constexpr bool router_in_grid = kRouter;
  const int expert_blocks = static_cast<int>(gridDim.x) - rt.blocks;
  auto shared_gate = [&] {
    if (a.shared_gate_logit == nullptr) return 1.0f;
    // Written by this grid's router blocks (through L2: this SM's L1 may hold the last layer's
    // value at the same address), or by the launch before.
    return 1.0f / (1.0f + expf(-(kRouter ? __ldcg(a.shared_gate_logit) : a.shared_gate_logit[0])));
  };
  if (shared_block) {
    // With the router in the grid the gate logit is read before the down products (below).
    if (!router_in_grid && warp == 0 && lane == 0) s_w[0] = shared_gate();
    if (!a.x_written_earlier) QuantizeI16(a.x, nsb, xq, xsc, sxs, warp, kFusedWarps, lane);
  } else if (warp == picker) {
    if (router_in_grid) WaitRouterBlocks(rt);
    stamps.Stamp(kFusedProbeCountSeen);
    // Every block needs its pick's weight, hence all K picks.
    // Through L2 when the router blocks wrote them during this grid (this SM's L1 may hold the last
    // layer's logits, which sat at the same addresses).
    WarpPickLogits<kPer>(a.logits, a.E, a.K, s_ids, s_w, router_in_grid,
                         [&](unsigned every) {
                           stamps.StampAfter(kFusedProbeLogitsLoaded, every);
                           stamps.Reloads(a.logits, a.E, a.table);
                         });
    stamps.Stamp(kFusedProbePicked);
    const float w = PickWeights(s_w, a.K);
    __syncwarp();  // every lane has read s_w
    if (lane < a.K) s_w[lane] = w;
    if (local == 0 && k == a.K - 1 && lane < a.K) {
      const int e = s_ids[lane];
      a.experts_out[lane] = e;
      a.weights_out[lane] = w;
      if (!(e >= 0 && e < a.E && tgate[e] != nullptr)) *a.error = 1;
    }
  } else if (!a.x_written_earlier) {
    QuantizeI16(a.x, nsb, xq, xsc, sxs, warp < picker ? warp : warp - 1, kFusedWarps - 1, lane);
  }
  __syncthreads();
  stamps.Stamp(kFusedProbeRouted);
  if (router_in_grid && !shared_block && threadIdx.x == 0) ConsumeRouter(rt, expert_blocks);
  const int e = shared_block ? 0 : s_ids[k];
  // A flagged pick computes nothing (uniform over the cluster, which shares k); its blocks still
  // pass the cluster barriers at the start and the end.
  const bool ok = shared_block || (e >= 0 && e < a.E && tgate[e] != nullptr);
  const int own_rows = slice_cols / kFusedCluster;  // gate/up rows of this block: 16, or 8 shared
  const int half = slice & 1, sbi = slice >> 1;  // a routed slice within its down super-block
  if (ok && !shared_block) {
    // Gate/up rows of this warp first (they gate everything after), then the block's down rows.
    const int row0 = slice * kFusedSliceCols + rank * kGateUpRows + warp * kWarpRows;
    const int mat_bytes = kWarpRows * row_bytes;
    uint8_t* wwarp = wgu + warp * 2 * mat_bytes;
    WarpCopyGateUpRows(wwarp, mat_bytes, tgate[e], tup[e], row0, row_bytes, mat_bytes / 16, lane);
    // The block's down rows' super-blocks, copied once the gate/up products are done. No L2
    // prefetch of them here: asking for them with the gate/up rows (one bulk prefetch a row, until
    // 2026-12-05) slowed batch-1 decode by 1.7% (docs/PERF.md, forty-second session).
    const uint8_t* d = static_cast<const uint8_t*>(tdown[e]) + static_cast<int64_t>(rank) * down_rows * down_row_bytes +
                       sbi * kSbBytes;
    CpAsyncWait<0>();  // this thread's gate/up copies
    __syncwarp();      // the warp's rows are visible to all its lanes
    stamps.Stamp(kFusedProbeGateUpLanded);  // warp 0's
    const int rps = 32 / nsb;
    const int rho = lane / nsb, sb = lane - rho * nsb;
    const bool valid = rho < kWarpRows && rho < rps;
    float acc[2][1] = {{0.0f}, {0.0f}};
    if (valid) {
      const uint8_t* wsb[2] = {wwarp + rho * row_bytes + sb * kSbBytes, wwarp + mat_bytes + rho * row_bytes + sb * kSbBytes};
      DotSuperBlockI16<2>(wsb, xq + sb * kXqSbStride, xsc[sb], sxs + sb * 8, acc);
    }
    for (int off = 1; off < nsb; off <<= 1) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const float o = __shfl_down_sync(0xFFFFFFFFu, acc[m][0], off);
        if (sb + off < nsb) acc[m][0] += o;
      }
    }
    if (valid && sb == 0) push_act(SiluQ4K(acc[0][0]) * acc[1][0], rank * own_rows + warp * kWarpRows + rho);
    __syncthreads();  // every warp is done with its gate/up rows: the region takes the down rows
    stamps.Stamp(kFusedProbeActWritten);
    // The act values are pushed before the down copies, whose issue can stall on the SM's busy
    // memory pipeline (docs/PERF.md, thirty-eighth session); the copies are in flight while the
    // pushes land.
    for (int c = t; c < 5 * down_rows; c += kThreads) {
      const int r = c / 5, part = c - 5 * r;
      const int from = part == 0 ? 0 : 16 + 64 * half + 16 * (part - 1);
      CpAsync16(wdn + r * kDownRowBytes + (part == 0 ? 0 : 16 * part), d + static_cast<int64_t>(r) * down_row_bytes + from);
    }
    CpAsyncCommit();
  } else if (shared_block) {
    // Q8_0 rows: 2 gate/up rows a warp, 16 lanes a row, h / 16 columns (whole Q8_0 blocks inside
    // one x super-block) a lane; the down rows' 64 columns are two Q8_0 blocks, 68 bytes a row at
    // a 4-byte aligned offset, copied 4 bytes at a time.
    const int q8_row = Q8RowBytes(a.h);
    const int row0 = slice * kFusedSharedSliceCols + rank * (kFusedSharedSliceCols / kFusedCluster) +
                     warp * kSharedWarpRows;
    const int mat_bytes = kSharedWarpRows * q8_row;
    uint8_t* wwarp = wgu + warp * 2 * mat_bytes;
    const uint8_t* g = static_cast<const uint8_t*>(sh.gate) + static_cast<int64_t>(row0) * q8_row;
    const uint8_t* u = static_cast<const uint8_t*>(sh.up) + static_cast<int64_t>(row0) * q8_row;
    for (int c = lane; c < mat_bytes / 16; c += 32) {
      CpAsync16(wwarp + 16 * c, g + 16 * c);
      CpAsync16(wwarp + mat_bytes + 16 * c, u + 16 * c);
    }
    CpAsyncCommit();
    // Down row j's 68 bytes (at j · sd_row + 68 · slice, 2-byte aligned) lie in the 16-byte pieces
    // from the boundary below them (5 or 6 pieces, none past their end), copied after the gate/up
    // products. Not prefetched into L2 here: as for the routed down rows, asking for them beside
    // the gate/up rows slowed batch-1 decode (+0.9% without it; docs/PERF.md, forty-second session).
    const int sd_row = Q8RowBytes(sh.inner);
    const uint8_t* sd = static_cast<const uint8_t*>(sh.down);
    auto at = [&](int r) { return static_cast<int64_t>(rank * down_rows + r) * sd_row + 68 * slice; };
    auto pieces = [&](int r) { return static_cast<int>(((at(r) & 15) + 68 + 15) >> 4); };
    CpAsyncWait<0>();
    __syncwarp();
    stamps.Stamp(kFusedProbeGateUpLanded);  // warp 0's
    const int rho = lane >> 4, part = lane & 15;
    const int cols = a.h / 16;  // a lane's columns: part · cols ..
    const int e0 = part * cols;
    const uint32_t* xw = reinterpret_cast<const uint32_t*>(xq + (e0 >> 8) * kXqSbStride + (e0 & 255));
    const float xs = xsc[e0 >> 8];
    const uint8_t* wrow = wwarp + rho * q8_row + (e0 / 32) * 34;
    float gsum = DotQ8Blocks(wrow, xw, cols / 32) * xs;
    float usum = DotQ8Blocks(wrow + mat_bytes, xw, cols / 32) * xs;
    for (int off = 1; off < 16; off <<= 1) {
      gsum += __shfl_xor_sync(0xFFFFFFFFu, gsum, off);
      usum += __shfl_xor_sync(0xFFFFFFFFu, usum, off);
    }
    if (part == 0) push_act(SiluQ4K(gsum) * usum, rank * own_rows + warp * kSharedWarpRows + rho);
    __syncthreads();  // every warp is done with its gate/up rows: the region takes the down rows
    stamps.Stamp(kFusedProbeActWritten);
    for (int c = t; c < 6 * down_rows; c += kThreads) {
      const int r = c / 6, piece = c - 6 * r;
      if (piece < pieces(r)) {
        CpAsync16(wdn + r * kSharedDownSpan + 16 * piece, sd + (at(r) & ~static_cast<int64_t>(15)) + 16 * piece);
      }
    }
    CpAsyncCommit();
  }
  // Once the cluster's pushes have landed (act_bar's phase 0), warp `picker` takes the slice's act
  // values (lane l the four values 4l .. 4l + 3) and quantizes them to int16 with one scale, keeping
  // the f32 sums of the four sub-blocks of 32 for the routed min term. A flagged pick's blocks
  // (uniform over the cluster) push nothing and wait for nothing.
  if (ok && warp == picker) {
    mbarrier::WaitParityCluster(act_bar, 0);
    const bool in = 4 * lane < slice_cols;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (in) v = *reinterpret_cast<const float4*>(act_all + 4 * lane);
    float mx = q4k::MaxAbs4(v);
    float s = (v.x + v.y) + (v.z + v.w);
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
    for (int off = 1; off < 8; off <<= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, off);  // 8 lanes a sub-block
    const float inv = I16Inverse(mx);
    if (in) {
      aw[2 * lane] = q4k::PackI16(v.x, v.y, inv);
      aw[2 * lane + 1] = q4k::PackI16(v.z, v.w, inv);
    }
    if ((lane & 7) == 0) a_sum[lane >> 3] = s;
    if (lane == 0) a_scale[0] = I16Scale(mx);
  }
  stamps.Stamp(kFusedProbeActGathered);
  // No block exits before every block of the cluster got here: each has then received every push
  // into it, so none is still sent to a block that left (the wait below, before the end). Relaxed:
  // it publishes nothing.
  ClusterArriveRelaxed();
  if (ok) {
    if (router_in_grid && shared_block && warp == 0) {
      WaitRouterBlocks(rt);
      if (lane == 0) s_w[0] = shared_gate();
    }
    CpAsyncWait<0>();  // the down rows
    __syncthreads();   // every thread's down copies and warp 0's act words (and the shared gate)
    stamps.Stamp(kFusedProbeDownLanded);
    if (router_in_grid && shared_block && threadIdx.x == 0) ConsumeRouter(rt, expert_blocks);
    const float ascale = a_scale[0];
    const float wk = s_w[shared_block ? 0 : k];
    if (shared_block) {
      const uint32_t* w = aw;
      const int sd_row = Q8RowBytes(sh.inner);
      for (int r = t; r < down_rows; r += kThreads) {
        const int j = rank * down_rows + r;
        const int skew = static_cast<int>((static_cast<int64_t>(j) * sd_row + 68 * slice) & 15);
        const float acc = DotQ8Blocks(wdn + r * kSharedDownSpan + skew, w, 2) * ascale;
        atomicAdd(a.y + j, wk * acc);
      }
    } else {
      uint32_t w[kSliceWords];
#pragma unroll
      for (int i = 0; i < kSliceWords / 4; ++i) {
        const uint4 v = reinterpret_cast<const uint4*>(aw)[i];
        w[4 * i] = v.x;
        w[4 * i + 1] = v.y;
        w[4 * i + 2] = v.z;
        w[4 * i + 3] = v.w;
      }
      const float4 sums = *reinterpret_cast<const float4*>(a_sum);
      float gate = 0.0f;  // σ(gate logit) when this block adds the given shared term
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
  }
  if constexpr (kProbe) {
    __syncthreads();  // every thread's additions issued
    stamps.Stamp(kFusedProbeSummed);
  }
  ClusterWait();
  stamps.Stamp(kFusedProbeExit);
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_KERNEL_CUH_
