// GdnDecodeFusedKernel: one launch for a GDN layer's decode middle (gdn_decode_fused.cuh); its
// launches and plans are in gdn_decode_fused.cu, the one file that includes this. Every value is
// computed with the operations, in the order, of the kernel it replaces, so that the outputs, the
// conv history and the state are the same bits as the four-kernel path:
//   conv          GdnConvKernel (gdn.cu) for one token: fmaf over the history taps, then the
//                 token's tap, SiLU;
//   q/k norms     GdnNormQkVecKernel<1> (gdn_tokens.cu), or <8> from kGdnPrepareShortRunBelow
//                 tokens on: lane l of a head's dk/4 lanes holds channels [4l, 4l+4), the sum of
//                 their squares (contracted into fma as that kernel is: SumSquaresXFirst/YFirst),
//                 the xor-butterfly GroupSum over the head's lanes, rsqrtf(ss + 1e-6), q's scale
//                 rsqrtf(dk) computed on the host;
//   gates         GdnGate (gdn_gates.cuh);
//   recurrence    GdnRecurrentKernel<dk, 8> (gdn.cu), same block shape and the same fixed-order
//                 sums over the warps;
//   gated norm    GdnGatedNormVecKernel (gdn_tokens.cu): a value head's dv/4 lane partials (each
//                 the SumSquares of 4 consecutive outputs) are spread over the head's dv/32 blocks
//                 of the cluster; each block reads them all through distributed shared memory,
//                 runs the same butterfly and gives the sum to all its 32 columns.
// Cluster barriers: the q and k channels of a key head group are read by every block of its
// cluster, so their history is rewritten only after all have arrived (by the cluster's rank 0); a
// block's 32 v channels are its own. The gated variant also waits for the partial sums, and once
// more before exit, so that no block leaves while another still reads its shared memory.
// The pieces those steps share with the kernels they replace are in gdn_decode_parts.cuh; the
// stacked input product (kIn) in gdn_decode_in.cuh, the output product (kOut) in gdn_decode_out.cuh.
//
// Its definitions sit in an anonymous namespace (with the probe's constant-memory buffer): one
// translation unit, gdn_decode_fused.cu, instantiates and launches them.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_FUSED_KERNEL_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_FUSED_KERNEL_CUH_

#include <cooperative_groups.h>

#include <cstdint>

#include "gpu_service/backends/cuda/armed_stamps.cuh"
#include "gpu_service/backends/cuda/cluster_barrier.cuh"
#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_in.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_out.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_out_probe.h"
#include "gpu_service/backends/cuda/kernels/gdn_decode_parts.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_delta_rule.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_gates.cuh"
#include "gpu_service/backends/cuda/kernels/q8x8_columns.cuh"
#include "gpu_service/backends/cuda/load_acquire.cuh"
#include "gpu_service/backends/cuda/mbarrier.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;  // GdnRecurrentKernel's kRecurrentWarps: the same partial sums
constexpr int kThreads = 32 * kWarps;
constexpr int kCols = kGdnDecodeBlockCols;  // value columns a block (a lane each)
constexpr int kMaxClusterBlocks = 8;  // the portable cluster size
constexpr int kMaxNv = 256;  // the gate arrays in shared memory (GdnGate indexes them by value head)
// gdn_decode_out_probe.h's buffer and slot counter (constant memory: read at a block's exit, a
// constant-cache hit).
__constant__ ArmedStampRows g_gdn_out_probe;
__device__ unsigned g_gdn_out_probe_count;

// Thread 0's stamps of a stamped launch (GdnDecodeFusedArgs::out_probe: the kProbe instantiation);
// in the others every member compiles to nothing, so the kernel the step launches carries none of it.
template <bool kProbe>
struct GdnOutStamps {
  bool on = false;
  unsigned slot = 0;
  unsigned long long t[kProbe ? kGdnOutProbeStamps : 1] = {};
  __device__ GdnOutStamps() : on(kProbe && threadIdx.x == 0 && threadIdx.y == 0) {
    if constexpr (kProbe) {
      if (on) {
        t[kGdnOutProbeEntry] = GlobalTimerNs();
        slot = atomicAdd(&g_gdn_out_probe_count, 1u);
      }
    }
  }
  // Stamps once `dep` is known (armed_stamps.cuh's KnownNow).
  __device__ void After(int word, float dep) {
    if constexpr (kProbe) {
      if (on && KnownNow(dep)) t[word] = GlobalTimerNs();
    }
  }
  __device__ void Now(int word) {
    if constexpr (kProbe) {
      if (on) t[word] = GlobalTimerNs();
    }
  }
  __device__ bool active() const { return kProbe && on; }
  __device__ void Write(unsigned cluster) const {
    if (!active()) return;
    const ArmedStampRows config = g_gdn_out_probe;
    if (config.stamps == nullptr || slot >= config.capacity) return;
    unsigned long long* row = config.stamps + static_cast<unsigned long long>(slot) * kGdnOutProbeWords;
#pragma unroll
    for (int i = 0; i < kGdnOutProbeStamps; ++i) row[i] = t[i];
    row[kGdnOutProbeExit] = GlobalTimerNs();
    const unsigned smid = SmId();
    row[kGdnOutProbeSm] = smid;
    row[kGdnOutProbeBlock] = (static_cast<unsigned long long>(cluster) << 16) | (blockIdx.x + blockIdx.y * gridDim.x);
  }
};

// Block (vh, y, t): value head vh, columns [32y, 32y + 32), token t. The block convolves the
// 2·kDk q/k channels of its key head group (channel index i < kDk: q, < 2kDk: k) and its 32 v
// channels (i − 2kDk), a channel per thread plus a second one for the first threads when kDk is 128.
//
// kOut (kGated too; one token): then the gated outputs stay in shared memory, and the cluster
// computes the output product's part of its 256 columns for every row, added into a.out_y with
// atomics: the block's rows of its column super-block are copied into shared memory before the
// PDL wait (weights: they overlap the product before), the cluster's 256 outputs gathered through
// distributed shared memory and quantized to int16 (one scale a warp of 32 = a Q8_0 block), and
// each thread sums its rows' 8 blocks with dp2a (int8 weights × int16 outputs, exact in int32).
// Why: the gated norm and the output product were two more launches on the decode chain (~3 and
// ~5.5 us a GDN layer on the H200 timeline, docs/PERF.md, for 8.9 MB of weights, ~2 us of HBM).
//
// kIn (kOut too; gdn_decode_in.cuh): the layer's stacked input product [z; qkv; ba] is computed here
// first, each cluster the rows its key head group reads, into in.rows, which a.qkv, a.ba and a.z
// then name; its rows stream through a ring of bulk copies issued before the PDL wait.
// kProbe: the stamped instantiation (GdnDecodeFusedArgs::out_probe; kOut without kIn only).
// kLean (kOut without kIn or kProbe; GdnLean): 1, the one-token decode defaults compiled in as
// constants (one barrier, the rows polled, ssm_out's rows by bulk copies, the state read early, the
// short-run sums of squares), so that their alternatives' code is not in the kernel (on by default:
// 30.7 KB of machine code against 51.6 KB and +1.8% batch-1 decode, docs/PERF.md, sixty-fourth
// session); 2 (dk 128 only; the default, +1.1% more), also the 80B's GDN shapes (nk, nv, dv and kk:
// kGdnLean*). The launch takes it only where those are the arguments.
template <int kDk, bool kGated, bool kOut = false, bool kIn = false, bool kProbe = false, int kLean = 0>
__global__ void __launch_bounds__(kThreads, kIn ? 2 : 1)
GdnDecodeFusedKernel(GdnDecodeFusedArgs a, int nk, int nv, int dv, int kk, float q_scale, bool qk_x_first,
                     bool early_state, GdnInProduct in) {
  static_assert(kLean == 0 || (kOut && !kIn && !kProbe), "the lean forms are the output product's, unstamped");
  static_assert(kLean < 2 || kDk == kGdnLeanDk, "the shapes' form is the 80B's");
  if constexpr (kLean >= 1) {
    a.out_one_barrier = a.rows_polled = a.out_bulk = true;
    qk_x_first = early_state = true;
  }
  if constexpr (kLean >= 2) {
    nk = kGdnLeanNk;
    nv = kGdnLeanNv;
    dv = kGdnLeanDv;
    kk = kGdnLeanKk;
  }
  constexpr int kQk = 2 * kDk;
  constexpr int kConv = kQk + kCols;
  constexpr int kRows = kDk / kWarps;
  static_assert(kConv <= 2 * kThreads, "two channels a thread at most");
  static_assert(!kOut || (kGated && kThreads == kOutCols), "the output product: gated, a thread a column");
  extern __shared__ __align__(16) uint8_t out_sh[];  // kOut only (OutSharedBytes)
  __shared__ __align__(8) uint64_t out_bar;           // kOut with a.out_bulk: the rows' bulk copies
  __shared__ __align__(16) float qk[kQk];  // the group's q then k head: conv outputs, normalised in place
  __shared__ float vs[kCols];
  __shared__ float kv_part[kWarps][32], out_part[kWarps][32];
  __shared__ float gate_g[kMaxNv], gate_beta[kMaxNv];
  __shared__ __align__(16) float o_sh[kCols];  // gated: the block's outputs
  __shared__ float sq_part[kCols / 4];          // gated: their sums of squares, 4 outputs each
  // One barrier (kOut without kIn): every block's o_sh and sq_part, pushed into every block of the
  // cluster (st.async counted on push_bar) instead of read from theirs after a release cluster
  // barrier, whose GPU-scope MEMBAR sat on the layer's path (docs/PERF.md, forty-eighth session).
  constexpr bool kPush = kOut && !kIn;
  __shared__ __align__(16) float o_all[kPush ? kOutClusterBlocks * kCols : 1];
  __shared__ float sq_all[kPush ? kOutClusterBlocks * kCols / 4 : 1];
  __shared__ __align__(8) uint64_t push_bar;
  __shared__ __align__(8) uint64_t in_bar[kIn ? kInMaxSlots : 1];  // kIn: the ring's slots
  const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * 32 + lane;
  static_assert(!kProbe || (kOut && !kIn), "the probe stamps the output product's form without the input product");
  GdnOutStamps<kProbe> stamps;
  const int vh = blockIdx.x, r = nv / nk, group = vh / r;
  const int col = blockIdx.y * kCols + lane;
  const int c_dim = 2 * nk * kDk + nv * dv;
  auto channel = [&](int i) {
    if (i < kDk) return group * kDk + i;
    if (i < kQk) return nk * kDk + group * kDk + (i - kDk);
    return 2 * nk * kDk + vh * dv + static_cast<int>(blockIdx.y) * kCols + (i - kQk);
  };
  const int i0 = tid, i1 = tid + kThreads;
  const bool has0 = i0 < kConv, has1 = i1 < kConv;
  const int c0 = channel(i0), c1 = channel(i1);  // meaningful only with has0 / has1
  float w0[kGdnMaxConvKernel], w1[kGdnMaxConvKernel], last0, last1;
  LoadTaps(a.taps, has0, c0, kk, w0, last0);
  LoadTaps(a.taps, has1, c1, kk, w1, last1);
  const float gamma = kGated ? a.norm[col] : 0.0f;  // a weight too
  // GdnDecodeFusedArgs::out_one_barrier: thread tid forms the cluster's gated output of column tid
  // itself (its head's weight here; its z and raw output later).
  const bool one_barrier = kOut && !kIn && a.out_one_barrier;
  const float gamma_c = one_barrier ? a.norm[tid % dv] : 0.0f;
  // The token's state row (the host writes the rows before the step) and, with early_state, its
  // state column and conv history, which only this kernel writes, in earlier steps: read before
  // the PDL wait, so that they overlap the product before (pdl.cuh; the step's rows qkv, ba and z
  // only after the wait). Without early_state (TANDEM_OLD_GDN_EARLY_STATE=1) after it, the state
  // column first: its loads are the longest, in flight during the conv and the norms.
  const int64_t t = blockIdx.z;
  const int64_t seq = a.rows[t];
  float* history = a.history + seq * a.row_stride;
  float* S = a.state + seq * a.row_stride + (static_cast<int64_t>(vh) * kDk + warp * kRows) * dv + col;
  float s[kRows], h0[kGdnMaxConvKernel], h1[kGdnMaxConvKernel];
  auto load_old = [&] {
#pragma unroll
    for (int i = 0; i < kRows; ++i) s[i] = S[static_cast<int64_t>(i) * dv];
    LoadHistory(h0, history, has0, c_dim, c0, kk);
    LoadHistory(h1, history, has1, c_dim, c1, kk);
  };
  // The gates' thread (the block's last) holds its head's weights before the wait and loads its b
  // and a with the conv's x after it: one round trip to L2 behind the wait, not two in sequence.
  // (The form that loaded them after the conv's block barrier, TANDEM_OLD_GDN_GATE=1, was removed
  // on 2026-12-05: it read polled rows unpolled, and the 80B bench failed with it.)
  const bool gate_thread = tid == kThreads - 1;
  const float gate_dt_bias = gate_thread ? a.dt_bias[vh] : 0.0f, gate_ssm_a = gate_thread ? a.ssm_a[vh] : 0.0f;
  if (early_state) load_old();
  // kOut: the block's rows of the output matrix (constant weights) before the wait.
  const int out_rpb = kOut ? a.out_rows / kOutClusterBlocks : 0;
  const unsigned out_rank = kOut ? cg::this_cluster().block_rank() : 0u;
  const uint32_t out_bar_addr = kOut ? static_cast<uint32_t>(__cvta_generic_to_shared(&out_bar)) : 0u;
  const uint8_t* out_src = kOut ? a.out_w + static_cast<int64_t>(out_rank) * out_rpb * a.out_row_bytes +
                                      static_cast<int64_t>(group) * a.out_group_bytes
                                : nullptr;
  auto out_bytes = [&] { return static_cast<uint32_t>(out_rpb) * kOutSuperBytes; };  // a block's rows
  if constexpr (kOut && !kIn) {  // (kIn: into L2 below, after the ring's first chunks)
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(out_sh));
    if (a.out_bulk) {
      // Rows of kOutSuperBytes back to back (by columns): one run, a few bulk copies by thread 0,
      // which alone uses the barrier until the wait in OutProductPart (block barriers between).
      if (tid == 0) {
        mbarrier::Init(out_bar_addr, 1);
        mbarrier::InitFence();
        mbarrier::BulkCopyRunToShared(dst, out_src, out_bytes(), out_bar_addr);
      }
    } else {
      CopyColumnRows<kThreads>(dst, out_src, a.out_row_bytes, out_rpb, tid);
    }
  }
  // The one-barrier form's pushes: every block's push_bar initialised, expecting the cluster's o
  // and sq parts, before any block pushes (the relaxed cluster barrier after the init fence).
  const uint32_t push_bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&push_bar));
  if (kPush && one_barrier) {
    mbarrier::InitForClusterPushes(push_bar_addr, static_cast<uint32_t>(kOutClusterBlocks * (kCols + kCols / 4) * 4),
                                   tid == 0);
  }
  // Value v at index i of o_all or sq_all (base address) in every block of the cluster.
  auto push_all = [&](uint32_t base, int i, float v) {
    mbarrier::StoreAsyncToEveryBlock<kOutClusterBlocks>(base + 4u * static_cast<uint32_t>(i), v, push_bar_addr);
  };
  if (early_state) stamps.After(kGdnOutProbeStateRead, s[0]);  // (after the copies' issue)
  // kIn: the ring's first chunks of the input rows (weights) and the norm's early copies.
  const int in_rank = kIn ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
  const int in_cluster = kIn ? r * static_cast<int>(gridDim.y) : 1;
  const int in_chunks = kIn ? (InChunks(r, kDk, dv) - in_rank + in_cluster - 1) / in_cluster : 0;
  const InLayout& in_l = in.smem;
  const uint32_t in_bar0 = kIn ? static_cast<uint32_t>(__cvta_generic_to_shared(&in_bar[0])) : 0u;
  if constexpr (kIn) {
    InStamp(in, tid, 0);
    if (tid == 0) {
      for (int s = 0; s < in.slots; ++s) mbarrier::Init(in_bar0 + 8u * static_cast<uint32_t>(s), 1);
      mbarrier::Init(out_bar_addr, 1);  // ssm_out's rows, copied once the ring is free
      mbarrier::InitFence();
      const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(out_sh + in_l.ring));
      for (int i = 0; i < in.slots && i < in_chunks; ++i) IssueInChunk(in, i, in_rank, in_cluster, group, nk, r, kDk, dv, ring, in_bar0);
      // ssm_out's rows (by columns: one run) into L2 for OutProductPart's reads: the block's shared
      // memory holds the input rows' ring instead, so that two blocks fit an SM (one an SM gave 15
      // clusters of 8 on the H200, one fewer than the 80B layer's 16: a second wave).
      constexpr uint32_t kChunk = 16 * 1024;
      const uint32_t bytes = out_bytes();
      for (uint32_t off = 0; off < bytes; off += kChunk) PrefetchL2(out_src + off, bytes - off < kChunk ? bytes - off : kChunk);
    }
    InNormEarlyCopies(in, reinterpret_cast<float4*>(out_sh + in_l.area), tid);
  }
  // The product's rows: after its grid completes (pdl.cuh), or polled value by value (rows_polled).
  const bool rows_polled = kOut && !kIn && a.rows_polled;
  if (!rows_polled) PdlWaitForPrevious();  // pdl.cuh
  PdlAllowNext();
  if constexpr (kIn) {
    // x, then this block's chunks of the input rows as they land (a warp a row), each slot refilled
    // with the chunk `slots` ahead once every warp is done with it; then the cluster's rows are
    // visible to all its blocks (the barrier's release and acquire cover global memory).
    InStamp(in, tid, 1);
    int16_t* xq = reinterpret_cast<int16_t*>(out_sh + in_l.xq);
    float* xscale = reinterpret_cast<float*>(out_sh + in_l.xscale);
    InFormX(in, reinterpret_cast<float4*>(out_sh + in_l.area), xq, xscale, tid, lane, warp);
    InStamp(in, tid, 2);
    InLaneX lx;
    LoadInLaneX(xq, xscale, in.cols, lane, lx);
    const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(out_sh + in_l.ring));
    for (int i = 0; i < in_chunks; ++i) {
      const int slot = i % in.slots;
      mbarrier::WaitParity(in_bar0 + 8u * static_cast<uint32_t>(slot), static_cast<uint32_t>((i / in.slots) & 1));
      if (i == 0) InStamp(in, tid, 3);
      const InChunk c = InChunkOf(in, in_rank + i * in_cluster, group, nk, r, kDk, dv);
      if (warp < c.rows) {
        const uint8_t* row = out_sh + in_l.ring + (slot * kInChunkRows + warp) * in.row_bytes;
        const float v = InRowDot(row, lx, in.cols, lane);
        if (lane == 0) in.rows[c.row0 + warp] = v;
      }
      __syncthreads();  // every warp is done with the slot
      if (tid == 0 && i + in.slots < in_chunks) {
        IssueInChunk(in, i + in.slots, in_rank, in_cluster, group, nk, r, kDk, dv, ring, in_bar0);
      }
    }
    InStamp(in, tid, 4);
    // The ring, the norm's area and x's int16 are free (the loop's last barrier; x is in registers):
    // ssm_out's rows (asked into L2 before the wait) come into them by bulk copies now, while the
    // conv and the recurrence run. The cross-proxy fence orders the threads' earlier shared-memory
    // writes there before the copies' writes.
    if (tid == 0) {
      mbarrier::FenceProxyAsyncShared();
      mbarrier::BulkCopyRunToShared(static_cast<uint32_t>(__cvta_generic_to_shared(out_sh + in_l.ring)), out_src,
                                    out_bytes(), out_bar_addr);
    }
    ClusterArrive();
    ClusterWait();
    InStamp(in, tid, 5);
  }
  float gate_b = 0.0f, gate_a = 0.0f;
  if (gate_thread) {
    const float* row = GdnBaRow(a.ba, a.ba_stride, t, vh, r);
    gate_b = ReadRow(row + vh % r, rows_polled);
    gate_a = ReadRow(row + r + vh % r, rows_polled);
  }
  if (!early_state) load_old();
  const float* z_at = a.z + t * a.z_stride + static_cast<int64_t>(vh) * dv + col;
  float zv = kGated && warp == 0 && !rows_polled ? __ldcg(z_at) : 0.0f;  // polled: after the recurrence
  const float* x = a.qkv + t * a.qkv_stride;
  float x0, x1;
  const float y0 = ConvToken(w0, last0, h0, x0, x, has0, c0, kk, rows_polled);
  stamps.After(kGdnOutProbeConvRead, x0);
  const float y1 = ConvToken(w1, last1, h1, x1, x, has1, c1, kk, rows_polled);
  if (has0) {
    if (i0 < kQk) qk[i0] = y0; else vs[i0 - kQk] = y0;
  }
  if (has1) {
    if (i1 < kQk) qk[i1] = y1; else vs[i1 - kQk] = y1;
  }
  if (gate_thread) GdnGateOf(gate_b, gate_a, gate_dt_bias, gate_ssm_a, gate_g[vh], gate_beta[vh]);  // GdnGate's operations
  // This block has read its history (release); rank 0 overwrites the group's q/k history only after
  // every block of the cluster has arrived.
  if constexpr (!kGated) ClusterArrive();
  __syncthreads();
  // q/k norms: threads [0, kQk/4) (whole warps) as the lanes of GdnNormQkVecKernel<1>.
  if (tid < kQk / 4) {
    float4 y = *reinterpret_cast<const float4*>(qk + 4 * tid);
    const float ss = GroupSum(qk_x_first ? SumSquaresXFirst(y) : SumSquaresYFirst(y), kDk / 4);
    float scale = rsqrtf(ss + 1e-6f);
    if (4 * tid < kDk) scale *= q_scale;
    y = make_float4(y.x * scale, y.y * scale, y.z * scale, y.w * scale);
    *reinterpret_cast<float4*>(qk + 4 * tid) = y;
  }
  __syncthreads();
  // GdnRecurrentKernel<kDk, 8> for one token.
  const float* qs = qk;
  const float* ks = qk + kDk;
  const int r0 = warp * kRows;
  const float decay = expf(gate_g[vh]);
  const float b = gate_beta[vh];
  const float v = vs[lane];
  float out = DeltaRuleColumnStep<kRows, kWarps>(s, qs + r0, ks + r0, decay, b, v, kv_part, warp, lane);
  out_part[warp][lane] = out;
#pragma unroll
  for (int i = 0; i < kRows; ++i) S[static_cast<int64_t>(i) * dv] = s[i];
  __syncthreads();
  float* o = a.o + t * nv * dv + static_cast<int64_t>(vh) * dv + col;
  if (warp == 0) {
    out = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) out += out_part[w][lane];
    stamps.After(kGdnOutProbeRecurrence, out);
    if constexpr (kGated) {
      o_sh[lane] = out;
      if (kPush && one_barrier) {
        push_all(static_cast<uint32_t>(__cvta_generic_to_shared(o_all)), static_cast<int>(out_rank) * kCols + lane, out);
      }
    } else {
      *o = out;
    }
  }
  const bool writes_qk_history = cg::this_cluster().block_rank() == 0;
  float xv_c = 0.0f;  // one_barrier: the cluster's gated output of column tid
  if constexpr (kGated) {
    // one_barrier: column tid of the cluster is column tid % dv of its value head tid / dv (held
    // by rank tid / dv + (tid % dv) / 32 · r, as OutProductPart gathers it).
    const int head_c = tid / dv;
    float z_c = 0.0f;
    if (one_barrier) {
      const float* z_c_at = a.z + t * a.z_stride + static_cast<int64_t>(group * r + head_c) * dv + tid % dv;
      z_c = rows_polled ? ReadRow(z_c_at, true) : __ldcg(z_c_at);
    } else if (rows_polled && warp == 0) {
      zv = ReadRow(z_at, true);  // z, the walk's last rows
    }
    __syncthreads();
    if (tid < kCols / 4) sq_part[tid] = SumSquaresYFirst(*reinterpret_cast<const float4*>(o_sh + 4 * tid));
    stamps.After(kGdnOutProbeZRead, z_c);
    if (kPush && one_barrier) {
      if (tid < kCols / 4) {
        push_all(static_cast<uint32_t>(__cvta_generic_to_shared(sq_all)), static_cast<int>(out_rank) * (kCols / 4) + tid,
                 sq_part[tid]);
      }
      // Every block's parts have landed here. A block pushes only after reading its history (its
      // values are used by then), so rank 0's history writes below come after every block's reads.
      mbarrier::WaitParityCluster(push_bar_addr, 0);
    } else {
      // The partial sums are visible to the cluster (and every block has read its history).
      ClusterArrive();
      ClusterWait();
    }
    stamps.Now(kGdnOutProbeSums);
    if (one_barrier) {
      // The gated norm's operations below for the cluster's column tid, from its head's blocks'
      // sums and its raw output (every warp one head's 32 columns: the same lanes, the same sums),
      // so that no second cluster barrier is needed before the output product's gather.
      const cg::cluster_group cluster = cg::this_cluster();
      const float scale = HeadRmsScale<true>(sq_all, head_c, r, dv, lane, a.eps);
      const unsigned rank_c = static_cast<unsigned>(head_c + ((tid % dv) / kCols) * r);
      const float raw = o_all[rank_c * kCols + lane];
      xv_c = gamma_c * (raw * scale) * SiluF(z_c);
      if (a.o != nullptr && rank_c == cluster.block_rank()) *o = xv_c;  // this block's own column
      // Done with the others' o_sh and sq_part: OutProductSum arrives once xv_c is stored.
    } else if (warp == 0) {
      const float scale = HeadRmsScale(sq_part, vh % r, r, dv, lane, a.eps);
      const float gated = gamma * (o_sh[lane] * scale) * SiluF(zv);
      if constexpr (kOut) {
        o_sh[lane] = gated;
        if (a.o != nullptr) *o = gated;
      } else {
        *o = gated;
      }
    }
  } else {
    ClusterWait();
  }
  if (has0 && (i0 >= kQk || writes_qk_history)) StoreHistory(h0, x0, history, c_dim, c0, kk);
  if (has1 && (i1 >= kQk || writes_qk_history)) StoreHistory(h1, x1, history, c_dim, c1, kk);
  if constexpr (kOut) {
    if constexpr (kIn) InStamp(in, tid, 6);
    if (stamps.active() && a.out_bulk) {
      mbarrier::WaitParity(out_bar_addr, 0);
      stamps.Now(kGdnOutProbeRowsLanded);
    }
    if (one_barrier) {
      OutProductSum(a, xv_c, out_sh, out_rpb, out_rank, tid, lane, warp, out_bar_addr);
    } else {
      OutProductPart<kIn>(a, o_sh, out_sh, out_rpb, out_rank, r, dv, tid, lane, warp, out_bar_addr,
                          kIn ? out_sh + in_l.ring : nullptr);
    }
    stamps.Now(kGdnOutProbeAdded);
    if constexpr (kIn) InStamp(in, tid, 7);
    // rows_polled: the product's grid before this one completes (pdl.cuh: a later kernel's wait on
    // this grid then covers it too).
    if (rows_polled) PdlWaitForPrevious();
    stamps.Write(static_cast<unsigned>(vh / r));
  } else if constexpr (kGated) {
    // No block exits while another may still read its sq_part (this block's reads of theirs are
    // complete: the gated value is stored above). Relaxed: it publishes nothing.
    ClusterArriveRelaxed();
    ClusterWait();
  }
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_FUSED_KERNEL_CUH_
