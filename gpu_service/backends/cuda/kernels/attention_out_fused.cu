// One-token decode attention and its output product in one launch (attention_out_fused.cuh).
//
// Block (h, c) of a cluster of eight along y, 256 threads:
//   before the PDL wait: o's rows of column super-block h in row slice c into shared memory (16-byte
//     cp.async, as ColumnSplitKernel), the cluster's push barrier, and the cached keys and values of
//     the first pass (positions before the token's own, appended by earlier steps) into registers;
//   after it: q's head h and its gate, the token's own key and value (the prep's append), then each
//     warp's keys four at a time (lane l: dims 8l .. 8l + 7) with an online softmax; the block's
//     warps merged in shared memory; the block's (max, sum, 256 sums) pushed into every block of the
//     cluster (st.async on an mbarrier: no cluster barrier with release, which would wait for the
//     row copies); every block merges the eight slices, gates, and runs the column product.
#include "gpu_service/backends/cuda/kernels/attention_out_fused.cuh"

#include <cooperative_groups.h>
#include <cuda.h>  // CUtensorMap (a type only: the encoder comes through cudaGetDriverEntryPointByVersion)
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "gpu_service/backends/cuda/armed_stamps.cuh"
#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/norm_rope_warp.cuh"
#include "gpu_service/backends/cuda/kernels/paged_kv.cuh"
#include "gpu_service/backends/cuda/kernels/q8x8_columns.cuh"
#include "gpu_service/backends/cuda/mbarrier.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/step_probe.h"

namespace tandem::cuda {
namespace {

constexpr int kHd = 256;          // one head = one super-block of o's columns
constexpr int kThreads = 256;     // thread t: dim t in the merges, column t in the product
constexpr int kWarps = kThreads / 32;
constexpr int kPer = kHd / 32;    // dims a lane
// Keys a warp a pass: 8 in the four-block form (one block an SM: registers to spare; a pass covers
// 64 keys, a context of 256 in one pass), 4 in the eight-block form (three an SM).
template <int kSlices>
constexpr int WarpKeysOf() {
  return kSlices == 8 ? 4 : 8;
}
// The forms (a template parameter): kSlices blocks a cluster, each a context slice of one head;
// four at one block an SM (up to kMaxRowsFour of o's rows a block: 209 KB at q3n-80b's 3072), or
// eight at three an SM (o's rows in two or more splits, 80 registers).
constexpr int kMaxRowsFour = 768;
constexpr int kMaxRowsEight = 640;
// Forms 1 and 2 (sixty-first session): o's rows in eight parts a head (128 blocks on q3n-80b, one
// an SM, 384 rows = 104 KB each), so that o's bytes come over as many SMs as the column-split
// product's; form 1 has no cluster (each block attends the whole context of its head: a few KB of
// keys read again by the head's eight blocks), form 2 clusters of two slices (64 clusters: one wave).
constexpr int kMaxRowsEighth = 768;
// The TMA's boxes a block (one barrier each): rows_per_block / box_rows at most.
constexpr int kMaxBoxes = 32;
static_assert(kThreads == kColumnSuperCols && kPer == 8, "a thread a column; two float4 a lane");

struct FusedArgs {
  // o's rows of the block's column super-block as a 2-D tensor (uint16 elements, rows × row_bytes)
  // whose boxes are `box_rows` rows of 272 bytes: the TMA copies them in rows_per_block / box_rows
  // operations (tma_rows), against a bulk copy a row or 17 cp.async pieces a row.
  CUtensorMap rows_map;
  bool tma_rows;
  int box_rows;
  int early_boxes;  // with late_rows and tma_rows: the first boxes still asked for before the wait
  const float* q;
  const float* qg;
  int64_t qg_stride;
  int nh, kvh;
  const int32_t* token_seq;
  const int32_t* token_pos;
  PagedKv cache;
  const uint8_t* w;
  int64_t row_bytes;
  int rows_per_block;
  float* y;
  bool bulk_rows;  // o's rows by one bulk copy each (the copy engine) rather than 16-byte cp.async
  bool late_rows;  // o's rows asked for after the PDL wait (not competing with the q/k prep)
  // The q/k prep inside (AttnOutFusedPrep; prep false: q comes normed and roped, the cache holds
  // the token's key): the raw rows of token 0, the norms' weights, the rotation.
  bool prep;
  const float* k_raw;
  const float* v_raw;
  const float* q_norm;
  const float* k_norm;
  const double* inv_freq;
  int rot;
  float eps;
};

// The warps' and the cluster's partial results (static shared memory: the same address in every
// block, which the pushes need).
template <int kSlices>
struct MergeArea {
  float wm[kWarps], wl[kWarps];
  __align__(16) float wacc[kWarps][kHd];
  float pm[kSlices > 1 ? kSlices : 1], pl[kSlices > 1 ? kSlices : 1];
  __align__(16) float pacc[kSlices > 1 ? kSlices : 1][kHd];
};

// This lane's 8 dims of the key and value at cache position `key` (through L2: other launches wrote
// them, and a reused page may sit in this SM's L1 from before).
__device__ __forceinline__ void LoadKeyValue(const PagedKv& c, int32_t seq, int64_t key, int kvw, int col,
                                             float4 (&k)[2], float4 (&v)[2]) {
  const int64_t off = CacheOffset(c, seq, key, kvw) + col;
  k[0] = __ldcg(reinterpret_cast<const float4*>(c.k + off));
  k[1] = __ldcg(reinterpret_cast<const float4*>(c.k + off + 4));
  v[0] = __ldcg(reinterpret_cast<const float4*>(c.v + off));
  v[1] = __ldcg(reinterpret_cast<const float4*>(c.v + off + 4));
}

__device__ __forceinline__ float Dot8(const float (&q)[kPer], const float4 (&k)[2]) {
  float d = q[0] * k[0].x;
  d = fmaf(q[1], k[0].y, d);
  d = fmaf(q[2], k[0].z, d);
  d = fmaf(q[3], k[0].w, d);
  d = fmaf(q[4], k[1].x, d);
  d = fmaf(q[5], k[1].y, d);
  d = fmaf(q[6], k[1].z, d);
  return fmaf(q[7], k[1].w, d);
}

__device__ __forceinline__ void AddScaled(float (&acc)[kPer], float p, const float4 (&v)[2]) {
  acc[0] = fmaf(p, v[0].x, acc[0]);
  acc[1] = fmaf(p, v[0].y, acc[1]);
  acc[2] = fmaf(p, v[0].z, acc[2]);
  acc[3] = fmaf(p, v[0].w, acc[3]);
  acc[4] = fmaf(p, v[1].x, acc[4]);
  acc[5] = fmaf(p, v[1].y, acc[5]);
  acc[6] = fmaf(p, v[1].z, acc[6]);
  acc[7] = fmaf(p, v[1].w, acc[7]);
}

// The softmax merge of kN parts for this thread's dim: part p's max m[p], sum l[p] and accumulator
// v[p · kHd] (an empty part: max -inf); returns Σ_p e^(m[p] - max) v, with *max_out and the total
// Σ_p e^(m[p] - max) l[p] (max -inf and zeros when every part is empty).
template <int kN>
__device__ __forceinline__ float MergeParts(const float* m, const float* l, const float* v, float* max_out,
                                            float* total) {
  float mx = -INFINITY;
#pragma unroll
  for (int p = 0; p < kN; ++p) mx = fmaxf(mx, m[p]);
  float a = 0.0f, t = 0.0f;
#pragma unroll
  for (int p = 0; p < kN; ++p) {
    const float f = m[p] == -INFINITY ? 0.0f : expf(m[p] - mx);
    a = fmaf(f, v[p * kHd], a);
    t = fmaf(f, l[p], t);
  }
  *max_out = mx;
  *total = t;
  return a;
}

__device__ ArmedStampRows g_fused_probe;
__device__ unsigned g_fused_probe_count;

template <int kSlices, bool kProbe>
__global__ void __launch_bounds__(kThreads, kSlices == 8 ? 3 : 1)
    AttentionOutFusedKernel(const __grid_constant__ FusedArgs a) {
  constexpr uint32_t kPushBytes = kSlices * (kHd + 2) * sizeof(float);
  constexpr int kWarpKeys = WarpKeysOf<kSlices>(), kPassKeys = kWarps * kWarpKeys;
  namespace cg = cooperative_groups;
  unsigned long long* probe_row = nullptr;
  if constexpr (kProbe) {
    if (threadIdx.x == 0) probe_row = TakeArmedRow(g_fused_probe, &g_fused_probe_count, kAttnOutFusedProbeWords);
  }
  auto stamp = [&](int word) {
    if constexpr (kProbe) {
      if (probe_row != nullptr) probe_row[word] = GlobalTimerNs();
    }
  };
  stamp(kAttnOutFusedProbeEntry);
  extern __shared__ __align__(128) uint8_t sh[];  // 128: the TMA's boxes land at 128-byte boundaries
  __shared__ MergeArea<kSlices> area;
  __shared__ __align__(8) uint64_t push_bar, rows_bar;
  // With the TMA's boxes: one barrier a box, so that a box's rows are multiplied as soon as it lands.
  __shared__ __align__(8) uint64_t box_bar[kMaxBoxes];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head = blockIdx.x;
  const int rank = kSlices > 1 ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
  // Row split blockIdx.z of o's rows (each of its clusters attends the head again: the attention is
  // a few KB of keys, and smaller blocks let clusters be placed two or three an SM).
  const int row0 = (static_cast<int>(blockIdx.z) * kSlices + rank) * a.rows_per_block;
  // o's rows (constants) first, overlapping the kernels before.
  const uint32_t rows_sh = static_cast<uint32_t>(__cvta_generic_to_shared(sh));
  const uint8_t* rows_src = a.w + static_cast<int64_t>(row0) * a.row_bytes + static_cast<int64_t>(head) * kColumnSuperBytes;
  const uint32_t rows_bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&rows_bar));
  auto copy_rows = [&](int from_box, int to_box) {
    if (a.tma_rows) {
      // Boxes of box_rows rows: one thread each (a few a block), onto the box's own barrier.
      if (tid >= from_box && tid < to_box) {
        const uint32_t box_bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&box_bar[tid]));
        const int y = row0 + tid * a.box_rows, x = head * (kColumnSuperBytes / 2);
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                rows_sh + static_cast<uint32_t>(tid * a.box_rows * kColumnSuperBytes)),
            "l"(reinterpret_cast<uint64_t>(&a.rows_map)), "r"(x), "r"(y), "r"(box_bar_addr)
            : "memory");
      }
    } else if (a.bulk_rows) {
      for (int row = tid; row < a.rows_per_block; row += kThreads) {
        mbarrier::BulkCopyToShared(rows_sh + static_cast<uint32_t>(row * kColumnSuperBytes), rows_src + row * a.row_bytes,
                                   kColumnSuperBytes, rows_bar_addr);
      }
    } else {
      CopyColumnRows<kThreads>(rows_sh, rows_src, a.row_bytes, a.rows_per_block, tid);
    }
  };
  const int boxes = a.tma_rows ? a.rows_per_block / a.box_rows : 0;
  if (a.bulk_rows && tid == 0) {
    mbarrier::Init(rows_bar_addr, 1);
    mbarrier::InitFence();
    mbarrier::ArriveExpectTx(rows_bar_addr, static_cast<uint32_t>(a.rows_per_block) * kColumnSuperBytes);
  }
  if (a.tma_rows && tid < boxes) {
    const uint32_t box_bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&box_bar[tid]));
    mbarrier::Init(box_bar_addr, 1);
    mbarrier::InitFence();
    mbarrier::ArriveExpectTx(box_bar_addr, static_cast<uint32_t>(a.box_rows) * kColumnSuperBytes);
  }
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&push_bar));
  if constexpr (kSlices > 1) {
    mbarrier::InitForClusterPushes(bar, kPushBytes, tid == 0);  // (a cluster barrier: rows_bar's init seen)
  } else {
    __syncthreads();  // rows_bar's init seen by the block
  }
  if (!a.late_rows) {
    copy_rows(0, boxes);
  } else if (a.tma_rows && a.early_boxes > 0) {
    copy_rows(0, a.early_boxes < boxes ? a.early_boxes : boxes);
  }
  // The step's sequence and position come from the host (copied before the step): read before the
  // wait, as are the keys and values of earlier positions (earlier steps' appends).
  const int32_t seq = a.token_seq[0];
  const int64_t pos = a.token_pos[0], ctx = pos + 1;
  const int64_t chunk = (ctx + kSlices - 1) / kSlices;
  const int64_t begin = rank * chunk, end = ctx < begin + chunk ? ctx : begin + chunk;
  const int kvw = a.kvh * kHd, col = (head / (a.nh / a.kvh)) * kHd + lane * kPer;
  const int64_t first = begin + warp * kWarpKeys;
  // The prep inside: the rotation's f64 sines and cosines (thread i: value i), the norms' weights of
  // warp 0 (q) and warp 1 (the token's key, in the block whose slice holds it), and that row's cache
  // offset (the page table is the host's), all before the wait.
  __shared__ double sn[kHd], cs[kHd];
  __shared__ __align__(16) float q_sh[kHd], k_sh[kHd], v_sh[kHd];
  const bool holds_pos = begin <= pos && pos < end;  // block-uniform
  float gamma[kPer];
  int64_t append_at = -1;
  if (a.prep) {
    if (tid < a.rot) {
      const int half = a.rot / 2;
      sincos(static_cast<double>(pos) * a.inv_freq[tid < half ? tid : tid - half], &sn[tid], &cs[tid]);
    }
    const float* g = warp == 0 ? a.q_norm : a.k_norm;
#pragma unroll
    for (int j = 0; j < kPer; ++j) gamma[j] = warp < 2 ? g[32 * j + lane] : 0.0f;
    // One block writes the token's key and value of its kv head: the first query head's cluster,
    // row split 0, the slice that holds the position.
    if (holds_pos && head % (a.nh / a.kvh) == 0 && blockIdx.z == 0) {
      append_at = CacheOffset(a.cache, seq, pos, kvw) + (head / (a.nh / a.kvh)) * kHd;
    }
    __syncthreads();  // sn and cs, written by threads 0 .. rot - 1, are read by warps 0 and 1
  }
  float4 kr[kWarpKeys][2], vr[kWarpKeys][2];
#pragma unroll
  for (int k = 0; k < kWarpKeys; ++k) {
    const int64_t key = first + k;
    if (key < end && key < pos) {
      LoadKeyValue(a.cache, seq, key, kvw, col, kr[k], vr[k]);
    } else {
      kr[k][0] = kr[k][1] = vr[k][0] = vr[k][1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  PdlWaitForPrevious();  // pdl.cuh: q, the gate and the token's own key only after it
  PdlAllowNext();
  stamp(kAttnOutFusedProbeAfterWait);
  if (a.late_rows) copy_rows(a.tma_rows ? a.early_boxes : 0, boxes);
  if (a.prep) {
    // Warp 0: query head `head` (the raw q half of qg's row 0); warp 1, in the block holding the
    // position: the kv head's new key, normed and roped, and its value; into shared memory, and by
    // the appending block into the cache.
    if (warp == 0 || (warp == 1 && holds_pos)) {
      const float* src = warp == 0 ? a.qg + static_cast<int64_t>(head) * 2 * kHd
                                   : a.k_raw + static_cast<int64_t>(head / (a.nh / a.kvh)) * kHd;
      float x[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) x[j] = __ldcg(src + 32 * j + lane);
      float v[kPer];
      if (warp == 1) {
        const float* vsrc = a.v_raw + static_cast<int64_t>(head / (a.nh / a.kvh)) * kHd;
#pragma unroll
        for (int j = 0; j < kPer; ++j) v[j] = __ldcg(vsrc + 32 * j + lane);
      }
      float* row = warp == 0 ? q_sh : k_sh;
      // norm_rope_warp.cuh: the prep kernels' bits; the sines and cosines computed before the wait.
      WarpNormRopeRowWith<kPer>(x, gamma, kHd, a.eps, a.rot, row, [&](int i, int, double* s, double* c) {
        *s = sn[i];
        *c = cs[i];
      });
      if (warp == 1) {
#pragma unroll
        for (int j = 0; j < kPer; ++j) v_sh[32 * j + lane] = v[j];
        if (append_at >= 0) {
#pragma unroll
          for (int j = 0; j < kPer; ++j) {
            a.cache.k[append_at + 32 * j + lane] = row[32 * j + lane];
            a.cache.v[append_at + 32 * j + lane] = v[j];
          }
        }
      }
    }
    __syncthreads();  // q_sh, and k_sh / v_sh where the block holds the position
  }
  float q[kPer];
  {
    const float* qh = a.prep ? q_sh + lane * kPer : a.q + static_cast<int64_t>(head) * kHd + lane * kPer;
    const float4 q0 = a.prep ? *reinterpret_cast<const float4*>(qh) : __ldcg(reinterpret_cast<const float4*>(qh));
    const float4 q1 = a.prep ? *reinterpret_cast<const float4*>(qh + 4) : __ldcg(reinterpret_cast<const float4*>(qh + 4));
    const float scale = rsqrtf(static_cast<float>(kHd));
    q[0] = q0.x * scale;
    q[1] = q0.y * scale;
    q[2] = q0.z * scale;
    q[3] = q0.w * scale;
    q[4] = q1.x * scale;
    q[5] = q1.y * scale;
    q[6] = q1.z * scale;
    q[7] = q1.w * scale;
  }
  const float gate = __ldcg(a.qg + static_cast<int64_t>(head) * 2 * kHd + kHd + tid);
  // Key `key` (after the wait) into slot k: the token's own from the rows formed above with the prep
  // inside (another cluster appends it to the cache, unordered with this one), else from the cache.
  auto load_after_wait = [&](int64_t key, int k) {
    if (key == pos && a.prep) {  // this lane's 8 dims of the key and value
      kr[k][0] = *reinterpret_cast<const float4*>(k_sh + lane * kPer);
      kr[k][1] = *reinterpret_cast<const float4*>(k_sh + lane * kPer + 4);
      vr[k][0] = *reinterpret_cast<const float4*>(v_sh + lane * kPer);
      vr[k][1] = *reinterpret_cast<const float4*>(v_sh + lane * kPer + 4);
    } else {
      LoadKeyValue(a.cache, seq, key, kvw, col, kr[k], vr[k]);
    }
  };
#pragma unroll
  for (int k = 0; k < kWarpKeys; ++k) {
    if (first + k == pos && pos < end) load_after_wait(pos, k);
  }
  // The warp's keys, kWarpKeys a pass; the first pass's rows are loaded above.
  float m = -INFINITY, l = 0.0f, acc[kPer] = {};
  for (int64_t base = first; base < end; base += kPassKeys) {
    if (base != first) {
#pragma unroll
      for (int k = 0; k < kWarpKeys; ++k) {
        if (base + k < end) load_after_wait(base + k, k);
      }
    }
    float s[kWarpKeys];
#pragma unroll
    for (int k = 0; k < kWarpKeys; ++k) s[k] = Dot8(q, kr[k]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int k = 0; k < kWarpKeys; ++k) s[k] += __shfl_xor_sync(0xFFFFFFFFu, s[k], o);
    }
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kWarpKeys; ++k) {
      if (base + k >= end) s[k] = -INFINITY;
      mx = fmaxf(mx, s[k]);
    }
    const float m_new = fmaxf(m, mx);  // finite: key `base` is in the slice
    const float corr = expf(m - m_new);  // 0 on the first pass
    l *= corr;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] *= corr;
#pragma unroll
    for (int k = 0; k < kWarpKeys; ++k) {
      const float p = expf(s[k] - m_new);  // 0 past the slice
      l += p;
      AddScaled(acc, p, vr[k]);
    }
    m = m_new;
  }
  // The block's warps merged: thread t takes dim t.
  if (lane == 0) {
    area.wm[warp] = m;
    area.wl[warp] = l;
  }
  *reinterpret_cast<float4*>(&area.wacc[warp][lane * kPer]) = make_float4(acc[0], acc[1], acc[2], acc[3]);
  *reinterpret_cast<float4*>(&area.wacc[warp][lane * kPer + 4]) = make_float4(acc[4], acc[5], acc[6], acc[7]);
  __syncthreads();
  float mb, lb;
  const float ab = MergeParts<kWarps>(area.wm, area.wl, &area.wacc[0][tid], &mb, &lb);
  if constexpr (kProbe) {
    if (probe_row != nullptr && KnownNow(ab)) probe_row[kAttnOutFusedProbeSliceDone] = GlobalTimerNs();
  }
  float at, lt;
  if constexpr (kSlices > 1) {
    // Into every block of the cluster: this slice's sums, max and total.
    mbarrier::StoreAsyncToEveryBlock<kSlices>(
        static_cast<uint32_t>(__cvta_generic_to_shared(&area.pacc[rank][tid])), ab, bar);
    if (tid == 0) {
      mbarrier::StoreAsyncToEveryBlock<kSlices>(static_cast<uint32_t>(__cvta_generic_to_shared(&area.pm[rank])), mb, bar);
      mbarrier::StoreAsyncToEveryBlock<kSlices>(static_cast<uint32_t>(__cvta_generic_to_shared(&area.pl[rank])), lb, bar);
    }
    mbarrier::WaitParityCluster(bar, 0);  // every slice's pushes have landed here
    float mm;  // finite: slice 0 holds key 0
    at = MergeParts<kSlices>(area.pm, area.pl, &area.pacc[0][tid], &mm, &lt);
  } else {
    at = ab;  // the block held the whole context
    lt = lb;
  }
  stamp(kAttnOutFusedProbePushed);
  const float xv = at / lt * SigmoidF(gate);
  // The column-split product's last part (dense_colsplit.cu's ColumnSplitKernel).
  int16_t* xq = reinterpret_cast<int16_t*>(sh + static_cast<size_t>(a.rows_per_block) * kColumnSuperBytes);
  float* xscale = reinterpret_cast<float*>(xq + kColumnSuperCols);
  QuantizeColumnI16(xv, tid, lane, warp, xq, xscale);
  if (a.bulk_rows) {
    mbarrier::WaitParity(rows_bar_addr, 0);
  } else if (!a.tma_rows) {
    CpAsyncWait<0>();
  }
  __syncthreads();
  stamp(kAttnOutFusedProbeRowsLanded);
  for (int row = tid; row < a.rows_per_block; row += kThreads) {
    if (a.tma_rows) mbarrier::WaitParity(static_cast<uint32_t>(__cvta_generic_to_shared(&box_bar[row / a.box_rows])), 0);
    atomicAdd(a.y + row0 + row, ColumnSuperRowDot(sh + static_cast<size_t>(row) * kColumnSuperBytes, xq, xscale));
  }
  if constexpr (kProbe) {
    stamp(kAttnOutFusedProbeExit);
    if (probe_row != nullptr) {
      probe_row[kAttnOutFusedProbeKeys] = static_cast<unsigned long long>(end > begin ? end - begin : 0);
      probe_row[kAttnOutFusedProbeSm] = SmId();
      probe_row[kAttnOutFusedProbeBlock] =
          blockIdx.x + static_cast<unsigned long long>(gridDim.x) * (blockIdx.y + gridDim.y * blockIdx.z);
    }
  }
}

std::atomic<uint64_t> g_fused_launches{0};

// A/B switches of the sixtieth session (docs/PERF.md).
// TANDEM_ATTN_OUT_FUSED_ROWS: how a block brings in o's rows: 0 16-byte cp.async pieces, 1 a bulk
// copy a row, 2 the TMA's 2-D boxes (EncodeRowsMap).
ProcessInteger g_fused_rows_mode{[] { return EnvInteger("TANDEM_ATTN_OUT_FUSED_ROWS", 2, 0, 2); }};
// TANDEM_ATTN_OUT_FUSED_MIN_BOXES: the fewest TMA boxes a block's rows come in (default 6);
// TANDEM_ATTN_OUT_FUSED_EARLY_BOXES: with LATE_ROWS, how many of them are still asked for before the
// PDL wait (default 0).
ProcessInteger g_fused_min_boxes{[] { return EnvInteger("TANDEM_ATTN_OUT_FUSED_MIN_BOXES", 6, 1, 32); }};
ProcessInteger g_fused_early_boxes{[] { return EnvInteger("TANDEM_ATTN_OUT_FUSED_EARLY_BOXES", 0, 0, 32); }};
ProcessSwitch g_fused_one_per_sm{[] { return EnvSwitch("TANDEM_ATTN_OUT_FUSED_ONE_PER_SM"); }};

// w's rows as FusedArgs::rows_map: a 2-D tensor of uint16 (row_bytes / 2 a row, w.rows rows, rows
// row_bytes apart) with boxes of 136 × box_rows (one super-block of 272 bytes, box_rows rows: the
// largest power of two up to 256 dividing rpb, so that a block's boxes end at its last row).
cudaError_t EncodeRowsMap(const DeviceMatrix& w, int rpb, CUtensorMap* map, int* box_rows) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  int box = 256;
  while (box > 1 && rpb % box != 0) box /= 2;
  // At least g_fused_min_boxes boxes a block (finer pieces multiplied as they land), at most kMaxBoxes.
  while (box > 8 && rpb / box < g_fused_min_boxes.value()) box /= 2;
  if (box < 8 || rpb / box > kMaxBoxes) return cudaErrorNotSupported;  // a box's bytes (272 a row) a multiple of 128
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(w.row_bytes / 2), static_cast<cuuint64_t>(w.rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(w.row_bytes)};
  const cuuint32_t boxes[2] = {static_cast<cuuint32_t>(kColumnSuperBytes / 2), static_cast<cuuint32_t>(box)};
  const cuuint32_t steps[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(w.data), dims, strides, boxes, steps,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  *box_rows = box;
  return cudaSuccess;
}

ProcessSwitch g_fused_prep_inside{[] { return EnvSwitch("TANDEM_ATTN_OUT_FUSED_PREP"); }};
ProcessSwitch g_fused_late_rows{[] { return EnvSwitchDefaultOn("TANDEM_ATTN_OUT_FUSED_LATE_ROWS"); }};

ProcessSwitch g_attn_out_fused{[] { return EnvSwitchDefaultOn("TANDEM_ATTN_OUT_FUSED"); }};

// TANDEM_ATTN_OUT_FUSED_FORM: 1 (no cluster, the default), 2, 4 or 8 (clusters of that many slices).
ProcessInteger g_fused_form{[] { return EnvInteger("TANDEM_ATTN_OUT_FUSED_FORM", 1, 1, 8); }};

// A launch's shape: clusters of `slices` blocks, o's rows in `splits` parts, `rpb` rows a block.
// In the sixtieth session (docs/PERF.md) the eight-block clusters at one or two blocks an SM did not
// all find room at once (the last ran as a second wave, ~10 us late); at three an SM the spills and
// the row copies' issue delayed every wait. Clusters of four at one block an SM need a quarter of a
// GPC's SMs each. slices 0: no form takes the rows.
struct Form {
  int slices = 0, splits = 0, rpb = 0;
};
Form FormOf(int64_t rows, int want) {
  auto eight = [&]() -> Form {  // the fewest splits whose blocks fit three an SM
    for (int s : {2, 4}) {
      if (rows % (8 * s) == 0 && rows / (8 * s) <= 200) return Form{8, s, static_cast<int>(rows / (8 * s))};
    }
    return {};
  };
  auto four = [&]() -> Form {
    return rows % 4 == 0 && rows / 4 <= kMaxRowsFour ? Form{4, 1, static_cast<int>(rows / 4)} : Form{};
  };
  auto eighth = [&](int slices) -> Form {  // o's rows in eight parts a head, 8 / slices splits
    return rows % 8 == 0 && rows / 8 <= kMaxRowsEighth ? Form{slices, 8 / slices, static_cast<int>(rows / 8)} : Form{};
  };
  Form first = want == 8 ? eight() : want == 4 ? four() : eighth(want == 2 ? 2 : 1);
  if (first.slices == 0) first = four();
  return first.slices > 0 ? first : eight();
}

}  // namespace

bool AttentionOutFusedFits(const AttnShape& d, const DeviceMatrix& w) {
  return d.hd == kHd && d.nh > 0 && d.nh <= 65535 && d.kvh > 0 && d.nh % d.kvh == 0 && Q8_0x8RowsAligned(w) &&
         w.cols == static_cast<int64_t>(d.nh) * kHd && w.rows > 0 && FormOf(w.rows, 4).slices > 0;
}

cudaError_t LaunchAttentionOutFused(const float* q, const float* qg, int64_t qg_stride, const AttnShape& d,
                                    const int32_t* token_seq, const int32_t* token_pos, const PagedKv& cache,
                                    const DeviceMatrix& w, float* y, cudaStream_t stream,
                                    const AttnOutFusedPrep* prep) {
  if (!AttentionOutFusedFits(d, w)) return cudaErrorNotSupported;
  if (qg_stride == 0) qg_stride = static_cast<int64_t>(d.nh) * 2 * kHd;
  if (prep != nullptr && (prep->k == nullptr || prep->v == nullptr || prep->q_norm == nullptr ||
                          prep->k_norm == nullptr || (d.rot > 0 && prep->inv_freq == nullptr) || d.rot < 0 ||
                          d.rot > kHd || d.rot % 2 != 0)) {
    return cudaErrorInvalidValue;
  }
  if ((q == nullptr && prep == nullptr) || qg == nullptr || token_seq == nullptr || token_pos == nullptr || cache.k == nullptr ||
      cache.v == nullptr || cache.page_table == nullptr || y == nullptr || qg_stride < static_cast<int64_t>(d.nh) * 2 * kHd) {
    return cudaErrorInvalidValue;
  }
  const Form form = FormOf(w.rows, static_cast<int>(g_fused_form.value()));
  const bool stamped = ProbeDecodeStep();
  using Kernel = void (*)(const FusedArgs);
  static const Kernel kernels[4][2] = {{AttentionOutFusedKernel<4, false>, AttentionOutFusedKernel<4, true>},
                                       {AttentionOutFusedKernel<8, false>, AttentionOutFusedKernel<8, true>},
                                       {AttentionOutFusedKernel<1, false>, AttentionOutFusedKernel<1, true>},
                                       {AttentionOutFusedKernel<2, false>, AttentionOutFusedKernel<2, true>}};
  auto raise = [](Kernel k, int rows) {
    return cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(ColumnSharedBytes(rows)));
  };
  static const cudaError_t attr[4][2] = {{raise(kernels[0][0], kMaxRowsFour), raise(kernels[0][1], kMaxRowsFour)},
                                         {raise(kernels[1][0], kMaxRowsEight), raise(kernels[1][1], kMaxRowsEight)},
                                         {raise(kernels[2][0], kMaxRowsEighth), raise(kernels[2][1], kMaxRowsEighth)},
                                         {raise(kernels[3][0], kMaxRowsEighth), raise(kernels[3][1], kMaxRowsEighth)}};
  const int f = form.slices == 8 ? 1 : form.slices == 1 ? 2 : form.slices == 2 ? 3 : 0;
  if (attr[f][stamped ? 1 : 0] != cudaSuccess) return attr[f][stamped ? 1 : 0];
  const Kernel kernel = kernels[f][stamped ? 1 : 0];
  FusedArgs args{{},          false,    0,         0, q,    qg,    qg_stride, d.nh, d.kvh, token_seq, token_pos, cache, static_cast<const uint8_t*>(w.data),
                 w.row_bytes, form.rpb, y,         g_fused_rows_mode.value() == 1, g_fused_late_rows.on(),
                       prep != nullptr, prep != nullptr ? prep->k : nullptr, prep != nullptr ? prep->v : nullptr,
                       prep != nullptr ? prep->q_norm : nullptr, prep != nullptr ? prep->k_norm : nullptr,
                       prep != nullptr ? prep->inv_freq : nullptr, d.rot, d.eps};
  if (g_fused_rows_mode.value() == 2) {
    // A matrix or driver the TMA cannot describe falls back to a bulk copy a row (the same bytes).
    args.tma_rows = EncodeRowsMap(w, form.rpb, &args.rows_map, &args.box_rows) == cudaSuccess;
    args.bulk_rows = !args.tma_rows;
    args.early_boxes = static_cast<int>(g_fused_early_boxes.value());
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(d.nh), static_cast<unsigned>(form.slices), static_cast<unsigned>(form.splits));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = ColumnSharedBytes(form.rpb);
  if (g_fused_one_per_sm.on()) config.dynamicSmemBytes = std::max<size_t>(config.dynamicSmemBytes, 120 * 1024);
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = 1;
  attribute[0].val.clusterDim.y = static_cast<unsigned>(form.slices);
  attribute[0].val.clusterDim.z = 1;
  attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[1].val.programmaticStreamSerializationAllowed = PdlEnabled() ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 2;
  if (form.slices == 1) {  // no cluster
    attribute[0] = attribute[1];
    config.numAttrs = 1;
  }
  // Whether the grid's clusters can all be resident at once on an idle device (a second wave was
  // the first forms' loss): said once a form, on stderr, for the benchmarks' logs; not while the
  // stream is being captured (a graph's first step), so that nothing can disturb the capture.
  static std::atomic<bool> told[4] = {false, false, false, false};
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess) {
    (void)cudaGetLastError();
    capturing = cudaStreamCaptureStatusActive;
  }
  if (capturing == cudaStreamCaptureStatusNone && form.slices > 1 && !told[f].exchange(true)) {
    int clusters = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
    const int need = d.nh * form.splits;
    fprintf(stderr, "attention + o fused: clusters of %d, %d rows a block, %d clusters; at most %d resident at once%s\n",
            form.slices, form.rpb, need, e == cudaSuccess ? clusters : -1,
            e == cudaSuccess && clusters < need ? " (a second wave)" : "");
    if (e != cudaSuccess) (void)cudaGetLastError();
  }
  g_fused_launches.fetch_add(1, std::memory_order_relaxed);
  return cudaLaunchKernelEx(&config, kernel, args);
}

bool AttnOutFusedPrepInside() { return g_fused_prep_inside.on(); }
void SetAttnOutFusedPrepInside(bool on) { g_fused_prep_inside.set(on); }
int AttnOutFusedRowsMode() { return static_cast<int>(g_fused_rows_mode.value()); }
void SetAttnOutFusedRowsMode(int mode) { g_fused_rows_mode.set(mode < 0 || mode > 2 ? 0 : mode); }
int AttnOutFusedForm() { return static_cast<int>(g_fused_form.value()); }
void SetAttnOutFusedForm(int slices) { g_fused_form.set(slices == 8 || slices == 4 || slices == 2 ? slices : 1); }
bool AttnOutFused() { return g_attn_out_fused.on(); }
void SetAttnOutFused(bool on) { g_attn_out_fused.set(on); }
cudaError_t SetArmedAttentionOutFusedProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream) {
  return ArmStampRows(g_fused_probe, g_fused_probe_count, stamps, capacity, stream);
}
uint64_t AttentionOutFusedLaunches() { return g_fused_launches.load(std::memory_order_relaxed); }

}  // namespace tandem::cuda
