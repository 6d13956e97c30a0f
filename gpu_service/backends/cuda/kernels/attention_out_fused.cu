// One-token decode attention and its output product in one launch (attention_out_fused.cuh).
//
// Block (h, s), 256 threads, one an SM (o's rows of the block take ~104 KB of shared memory):
//   before the PDL wait: the cached keys and values of the first pass (positions before the token's
//     own, appended by earlier steps) into registers;
//   after it: o's rows of column super-block h in row part s asked for (the TMA's boxes onto one
//     barrier; or bulk copies or cp.async pieces), q's head h and its gate, the token's own key and
//     value (the prep's append), then each warp's keys eight at a time (lane l: dims 8l .. 8l + 7)
//     with an online softmax, the block's warps merged in shared memory, gated, and, once every row
//     has landed, multiplied by the block's rows.
// This is the sixty-first session's form (1d3ff15): the later refinements (a barrier a box with each
// row waiting for its own, the token's cache row found before the wait, boxes before the wait, the
// rows asked for after the loads, the grid (nh, parts)) were each neutral alone, and together with
// the code they added the kernel ran ~1.5 us an attention layer slower than this form on an H100
// (docs/PERF.md, sixty-third session); they were removed.
// Every block of a head attends the head's whole context again: at the contexts this kernel takes
// (kAttnOutFusedMaxKeys) that is a few hundred KB from L2 a block, against a grid boundary and a merge
// through global memory on the split path, or a cluster whose blocks must share a GPC (measured in the
// sixtieth and sixty-first sessions, docs/PERF.md: every cluster form lost).
#include "gpu_service/backends/cuda/kernels/attention_out_fused.cuh"

#include <cuda.h>  // CUtensorMap (a type only: the encoder comes through cudaGetDriverEntryPointByVersion)
#include <cudaTypedefs.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "gpu_service/backends/cuda/armed_stamps.cuh"
#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/kernels/norm_rope_warp.cuh"
#include "gpu_service/backends/cuda/kernels/paged_kv.cuh"
#include "gpu_service/backends/cuda/kernels/q8x8_columns.cuh"
#include "gpu_service/backends/cuda/matvec_core.cuh"
#include "gpu_service/backends/cuda/mbarrier.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/step_probe.h"

namespace tandem::cuda {
namespace {

constexpr int kHd = 256;          // one head = one super-block of o's columns
constexpr int kThreads = 256;     // thread t: dim t in the merge, row t (and t + 256 ...) in the product
constexpr int kWarps = kThreads / 32;
constexpr int kPer = kHd / 32;    // dims a lane
constexpr int kWarpKeys = 8;      // keys a warp a pass (a pass covers 64 keys)
constexpr int kPassKeys = kWarps * kWarpKeys;
// o's rows a block at most (209 KB of shared memory).
constexpr int kMaxRows = 768;
static_assert(kThreads == kColumnSuperCols && kPer == 8, "a thread a column; two float4 a lane");

struct FusedArgs {
  // o's rows of the block's column super-block as a 2-D tensor (uint16 elements, rows × row_bytes)
  // whose boxes are `box_rows` rows of 272 bytes (tma_rows), against a bulk copy a row (bulk_rows) or
  // 17 cp.async pieces a row (neither).
  CUtensorMap rows_map;
  bool tma_rows;
  int box_rows;
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
  bool bulk_rows;
  bool late_rows;  // o's rows asked for after the PDL wait (not competing with the kernels before)
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

// The warps' partial results.
struct MergeArea {
  float wm[kWarps], wl[kWarps];
  __align__(16) float wacc[kWarps][kHd];
};

// This lane's 8 dims of the key and value at cache position `key` (through L2: other launches wrote
// them, and a reused page may sit in this SM's L1 from before).
__device__ __forceinline__ void LoadKeyValueAt(const PagedKv& c, int64_t off, float4 (&k)[2], float4 (&v)[2]) {
  k[0] = __ldcg(reinterpret_cast<const float4*>(c.k + off));
  k[1] = __ldcg(reinterpret_cast<const float4*>(c.k + off + 4));
  v[0] = __ldcg(reinterpret_cast<const float4*>(c.v + off));
  v[1] = __ldcg(reinterpret_cast<const float4*>(c.v + off + 4));
}
__device__ __forceinline__ void LoadKeyValue(const PagedKv& c, int32_t seq, int64_t key, int kvw, int col,
                                             float4 (&k)[2], float4 (&v)[2]) {
  LoadKeyValueAt(c, CacheOffset(c, seq, key, kvw) + col, k, v);
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

template <bool kProbe>
__global__ void __launch_bounds__(kThreads, 1) AttentionOutFusedKernel(const __grid_constant__ FusedArgs a) {
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
  __shared__ MergeArea area;
  __shared__ __align__(8) uint64_t rows_bar;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head = blockIdx.x;
  const int row0 = static_cast<int>(blockIdx.z) * a.rows_per_block;  // row part blockIdx.z of o's rows
  const uint32_t rows_sh = static_cast<uint32_t>(__cvta_generic_to_shared(sh));
  const uint8_t* rows_src = a.w + static_cast<int64_t>(row0) * a.row_bytes + static_cast<int64_t>(head) * kColumnSuperBytes;
  const uint32_t rows_bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&rows_bar));
  auto copy_rows = [&] {
    if (a.tma_rows) {
      // Boxes of box_rows rows: one thread each (a few a block).
      if (tid < a.rows_per_block / a.box_rows) {
        const int y = row0 + tid * a.box_rows, x = head * (kColumnSuperBytes / 2);
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                rows_sh + static_cast<uint32_t>(tid * a.box_rows * kColumnSuperBytes)),
            "l"(reinterpret_cast<uint64_t>(&a.rows_map)), "r"(x), "r"(y), "r"(rows_bar_addr)
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
  if ((a.bulk_rows || a.tma_rows) && tid == 0) {
    mbarrier::InitExpectingBytes(rows_bar_addr, static_cast<uint32_t>(a.rows_per_block) * kColumnSuperBytes);
  }
  __syncthreads();  // rows_bar's init seen by the block
  if (!a.late_rows) copy_rows();
  // The step's sequence and position come from the host (copied before the step): read before the
  // wait, as are the keys and values of earlier positions (earlier steps' appends).
  const int32_t seq = a.token_seq[0];
  const int64_t pos = a.token_pos[0], ctx = pos + 1;
  const int64_t end = ctx;
  const int kvw = a.kvh * kHd, col = (head / (a.nh / a.kvh)) * kHd + lane * kPer;
  const int64_t first = warp * kWarpKeys;
  // The prep inside: the rotation's f64 sines and cosines (thread i: value i), the norms' weights of
  // warp 0 (q) and warp 1 (the token's key), and the appending block's cache offset (the page table
  // is the host's), all before the wait.
  __shared__ double sn[kHd], cs[kHd];
  __shared__ __align__(16) float q_sh[kHd], k_sh[kHd], v_sh[kHd];
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
    // One block writes the token's key and value of its kv head: the first query head's, row part 0.
    if (head % (a.nh / a.kvh) == 0 && blockIdx.z == 0) {
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
  if (a.late_rows) copy_rows();
  if (a.prep) {
    // Warp 0: query head `head` (the raw q half of qg's row 0); warp 1: the kv head's new key, normed
    // and roped, and its value; into shared memory, and by the appending block into the cache.
    if (warp < 2) {
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
    __syncthreads();  // q_sh, k_sh and v_sh
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
  // inside (another block appends it to the cache, unordered with this one), else from the cache.
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
    if (first + k == pos) load_after_wait(pos, k);
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
    const float m_new = fmaxf(m, mx);  // finite: key `base` is in the context
    const float corr = expf(m - m_new);  // 0 on the first pass
    l *= corr;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] *= corr;
#pragma unroll
    for (int k = 0; k < kWarpKeys; ++k) {
      const float p = expf(s[k] - m_new);  // 0 past the context
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
  float mb, lt;  // mb finite: warp 0 holds key 0
  const float at = MergeParts<kWarps>(area.wm, area.wl, &area.wacc[0][tid], &mb, &lt);
  stamp(kAttnOutFusedProbeAttended);
  const float xv = at / lt * SigmoidF(gate);
  // The column-split product's last part (dense_colsplit.cu's ColumnSplitKernel).
  int16_t* xq = reinterpret_cast<int16_t*>(sh + static_cast<size_t>(a.rows_per_block) * kColumnSuperBytes);
  float* xscale = reinterpret_cast<float*>(xq + kColumnSuperCols);
  QuantizeColumnI16(xv, tid, lane, warp, xq, xscale);
  if (a.bulk_rows || a.tma_rows) {
    mbarrier::WaitParity(rows_bar_addr, 0);
  } else {
    CpAsyncWait<0>();
  }
  __syncthreads();
  stamp(kAttnOutFusedProbeRowsLanded);
  for (int row = tid; row < a.rows_per_block; row += kThreads) {
    atomicAdd(a.y + row0 + row, ColumnSuperRowDot(sh + static_cast<size_t>(row) * kColumnSuperBytes, xq, xscale));
  }
  if constexpr (kProbe) {
    stamp(kAttnOutFusedProbeExit);
    if (probe_row != nullptr) {
      probe_row[kAttnOutFusedProbeKeys] = static_cast<unsigned long long>(ctx);
      probe_row[kAttnOutFusedProbeSm] = SmId();
      probe_row[kAttnOutFusedProbeBlock] =
          blockIdx.x + static_cast<unsigned long long>(gridDim.x) * blockIdx.z;
    }
  }
}

std::atomic<uint64_t> g_fused_launches{0};

// The sixty-first session's A/B switches (docs/PERF.md).
// TANDEM_ATTN_OUT_FUSED_ROWS: how a block brings in o's rows: 0 16-byte cp.async pieces, 1 a bulk
// copy a row, 2 the TMA's 2-D boxes (EncodeRowsMap; the default).
ProcessInteger g_fused_rows_mode{[] { return EnvInteger("TANDEM_ATTN_OUT_FUSED_ROWS", 2, 0, 2); }};
// TANDEM_ATTN_OUT_FUSED_LATE_ROWS=0: o's rows asked for before the PDL wait, while the q product
// and the prep still run (their L2 round trips slowed more than the rows gained: docs/PERF.md).
ProcessSwitch g_fused_late_rows{[] { return EnvSwitchDefaultOn("TANDEM_ATTN_OUT_FUSED_LATE_ROWS"); }};
ProcessSwitch g_fused_prep_inside{[] { return EnvSwitch("TANDEM_ATTN_OUT_FUSED_PREP"); }};
ProcessSwitch g_attn_out_fused{[] { return EnvSwitchDefaultOn("TANDEM_ATTN_OUT_FUSED"); }};

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
  if (box < 8) return cudaErrorNotSupported;  // a box's bytes (272 a row) a multiple of 128
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

// o's rows a block: rows / parts for the most parts of 8, 4, 2, 1 whose nh · parts blocks fit one
// wave of one block an SM (o's bytes come in over as many SMs as the grid has; halving the parts
// measured 4% slower: docs/PERF.md, sixty-first session), at most kMaxRows. 0: none fits.
int RowsPerBlock(int64_t rows, int nh) {
  const int sms = fastmv::DeviceSmCount();
  for (int parts : {8, 4, 2, 1}) {
    if (rows % parts == 0 && rows / parts <= kMaxRows && (static_cast<int64_t>(nh) * parts <= sms || parts == 1)) {
      return static_cast<int>(rows / parts);
    }
  }
  return 0;
}

}  // namespace

bool AttentionOutFusedFits(const AttnShape& d, const DeviceMatrix& w) {
  return d.hd == kHd && d.nh > 0 && d.nh <= 65535 && d.kvh > 0 && d.nh % d.kvh == 0 && Q8_0x8RowsAligned(w) &&
         w.cols == static_cast<int64_t>(d.nh) * kHd && w.rows > 0 && RowsPerBlock(w.rows, d.nh) > 0;
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
  const int rpb = RowsPerBlock(w.rows, d.nh);
  const bool stamped = ProbeDecodeStep();
  using Kernel = void (*)(const FusedArgs);
  const Kernel kernel = stamped ? AttentionOutFusedKernel<true> : AttentionOutFusedKernel<false>;
  static const cudaError_t attr[2] = {
      cudaFuncSetAttribute(AttentionOutFusedKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(ColumnSharedBytes(kMaxRows))),
      cudaFuncSetAttribute(AttentionOutFusedKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(ColumnSharedBytes(kMaxRows)))};
  if (attr[stamped ? 1 : 0] != cudaSuccess) return attr[stamped ? 1 : 0];
  FusedArgs args{};
  args.q = q;
  args.qg = qg;
  args.qg_stride = qg_stride;
  args.nh = d.nh;
  args.kvh = d.kvh;
  args.token_seq = token_seq;
  args.token_pos = token_pos;
  args.cache = cache;
  args.w = static_cast<const uint8_t*>(w.data);
  args.row_bytes = w.row_bytes;
  args.rows_per_block = rpb;
  args.y = y;
  args.late_rows = g_fused_late_rows.on();
  args.bulk_rows = g_fused_rows_mode.value() == 1;
  if (g_fused_rows_mode.value() == 2) {
    // A matrix or driver the TMA cannot describe falls back to a bulk copy a row (the same bytes).
    args.tma_rows = EncodeRowsMap(w, rpb, &args.rows_map, &args.box_rows) == cudaSuccess;
    args.bulk_rows = !args.tma_rows;
  }
  if (prep != nullptr) {
    args.prep = true;
    args.k_raw = prep->k;
    args.v_raw = prep->v;
    args.q_norm = prep->q_norm;
    args.k_norm = prep->k_norm;
    args.inv_freq = prep->inv_freq;
  }
  args.rot = d.rot;
  args.eps = d.eps;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(d.nh), 1, static_cast<unsigned>(w.rows / rpb));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = ColumnSharedBytes(rpb);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = PdlEnabled() ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 1;
  g_fused_launches.fetch_add(1, std::memory_order_relaxed);
  return cudaLaunchKernelEx(&config, kernel, args);
}

bool AttnOutFusedPrepInside() { return g_fused_prep_inside.on(); }
void SetAttnOutFusedPrepInside(bool on) { g_fused_prep_inside.set(on); }
int AttnOutFusedRowsMode() { return static_cast<int>(g_fused_rows_mode.value()); }
void SetAttnOutFusedRowsMode(int mode) { g_fused_rows_mode.set(mode < 0 || mode > 2 ? 2 : mode); }
bool AttnOutFusedLateRows() { return g_fused_late_rows.on(); }
void SetAttnOutFusedLateRows(bool on) { g_fused_late_rows.set(on); }
bool AttnOutFused() { return g_attn_out_fused.on(); }
void SetAttnOutFused(bool on) { g_attn_out_fused.set(on); }
cudaError_t SetArmedAttentionOutFusedProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream) {
  return ArmStampRows(g_fused_probe, g_fused_probe_count, stamps, capacity, stream);
}
uint64_t AttentionOutFusedLaunches() { return g_fused_launches.load(std::memory_order_relaxed); }

}  // namespace tandem::cuda
