// The hd-256 wgmma prefill attention over f16 tiles (AttnKv16(), attention.cuh): K and V are
// converted from the paged f32 cache once per call, not in every block.
//
// The wgmma kernel of attention_tc_wgmma.cu copies each 64-key f32 K (and V) tile of its item into
// a 64 KiB stage and converts it to f16 into its swizzled K slab (transposed Vt slab). Every
// query-row block of a kv head repeats that for every key tile it attends (at 8192 tokens a tile
// is converted by up to 512 blocks) and moves twice the bytes f16 would.
//
// KvTilesF16Kernel writes, per physical page and kv head, the byte images of those two slabs
// (f16_tiles: [page][kv head] {K 32 KiB, Vt 32 KiB}, attention_tc_wgmma.cuh's layouts) with the
// conversions of ConvertK / ConvertV (PackF16x2, round to nearest; keys past the sequence's last
// position zero). Tiles are indexed by physical page, so the kernel needs no per-sequence offset
// and any batch of sequences fits a scratch sized for the pool; a page belongs to one sequence
// (the backend's pages are never shared), so no two blocks write the same tile.
//
// WgmmaKv16AttentionKernel is the wgmma kernel with the f32 stage gone: each tile is 2 x 2048
// cp.async chunks of 16 bytes straight into a K and a Vt slab, and the freed 64 KiB hold a second
// pair of slabs: tile t + 1 is copied during all of tile t's S, softmax and O += P·V, one block
// barrier per tile. Keys past the item's own last position are zero-filled by the copy (cp.async
// src-size: whole K chunks, and the first 2·(valid − 8b) bytes of a Vt chunk of key octet b), as
// the stage's zero fill did, so the slabs hold exactly the f32 kernel's bytes, and S, softmax,
// P and O are computed by the same instructions (attention_tc_wgmma.cuh): bit-identical outputs.
//
// WgmmaKv16OverlapAttentionKernel (TANDEM_ATTN_KV16=2) is that kernel with FlashAttention-3's
// intra-warpgroup overlap: S(t + 1) is issued before the softmax of tile t (see its comment).
#include <cuda_fp16.h>

#include <algorithm>

#include "gpu_service/backends/cuda/kernels/attention_tc.cuh"
#include "gpu_service/backends/cuda/kernels/attention_tc_common.cuh"
#include "gpu_service/backends/cuda/kernels/attention_tc_wgmma.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/wgmma_f16.cuh"

namespace tandem::cuda {
namespace {

using attn_tc::BlockOf;
using attn_tc::OnlineSoftmaxTile;
using attn_tc::RescaleRows;
using attn_tc::StoreRows;
using attn_tc::TcBlock;
using attn_wg::kHd;
using attn_wg::kKBytes;
using attn_wg::kKeys;
using attn_wg::kKSlab;
using attn_wg::kQBytes;
using attn_wg::kThreads;
using attn_wg::kVtBytes;
using attn_wg::kWgRows;

static_assert(kKBytes == kVtBytes && kKBytes == kThreads * 8 * 16, "a slab is 8 chunks of 16 bytes per thread");
constexpr uint32_t kTileBytes = kKBytes;                // one K or Vt image
constexpr uint32_t kPageHeadBytes = 2 * kTileBytes;     // K then Vt, per (page, kv head)

// ---- Conversion: the tiles of every sequence's keys 0 .. last position ----

// One K tile (64 keys of kv head `kvhead` on `page`) as the K slab image at dst: thread tid
// converts dims 8q .. 8q + 7 (q = tid % 32) of keys tid / 32 + 8i into one 16-byte chunk; a warp
// reads 1 KiB of one key and writes one whole 128-byte row of each slab.
__device__ __forceinline__ void ConvertKTile(const float* pool, int32_t page, int kvhead, int kvw, int valid,
                                             uint8_t* dst, int tid) {
  const int qd = tid & 31, j0 = tid >> 5;
  const float* src = pool + (static_cast<int64_t>(page) * kKeys + j0) * kvw + kvhead * kHd + 8 * qd;
  float4 x[8][2];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const bool ok = j0 + 8 * i < valid;  // keys past the sequence's end: zero (unwritten cache may hold NaN)
    const float4* p = reinterpret_cast<const float4*>(src + static_cast<int64_t>(8 * i) * kvw);
    x[i][0] = ok ? p[0] : make_float4(0.f, 0.f, 0.f, 0.f);
    x[i][1] = ok ? p[1] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int j = j0 + 8 * i;
    *reinterpret_cast<uint4*>(dst + (qd >> 3) * kKSlab + wgmma::SwizzledOffset(j, qd & 7)) =
        make_uint4(PackF16x2(x[i][0].x, x[i][0].y), PackF16x2(x[i][0].z, x[i][0].w), PackF16x2(x[i][1].x, x[i][1].y),
                   PackF16x2(x[i][1].z, x[i][1].w));
  }
}

// One V tile as the Vt slab image at dst: lane (b = lane % 8, cq = lane / 8) converts key octet b
// of dims 4c .. 4c + 3 (c = 4·(warp + 8h) + cq, h < 2) into 4 chunks (rows 4c .. 4c + 3, chunk b):
// a warp writes 16 whole 128-byte rows and reads 64 contiguous bytes per key.
__device__ __forceinline__ void ConvertVTile(const float* pool, int32_t page, int kvhead, int kvw, int valid,
                                             uint8_t* dst, int tid) {
  const int lane = tid & 31, warp = tid >> 5, b = lane & 7, cq = lane >> 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int c = 4 * (warp + 8 * h) + cq;
    const float* src = pool + (static_cast<int64_t>(page) * kKeys + 8 * b) * kvw + kvhead * kHd + 4 * c;
    float4 x[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      x[k] = 8 * b + k < valid ? *reinterpret_cast<const float4*>(src + static_cast<int64_t>(k) * kvw)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const uint4 d0 = make_uint4(PackF16x2(x[0].x, x[1].x), PackF16x2(x[2].x, x[3].x), PackF16x2(x[4].x, x[5].x),
                                PackF16x2(x[6].x, x[7].x));
    const uint4 d1 = make_uint4(PackF16x2(x[0].y, x[1].y), PackF16x2(x[2].y, x[3].y), PackF16x2(x[4].y, x[5].y),
                                PackF16x2(x[6].y, x[7].y));
    const uint4 d2 = make_uint4(PackF16x2(x[0].z, x[1].z), PackF16x2(x[2].z, x[3].z), PackF16x2(x[4].z, x[5].z),
                                PackF16x2(x[6].z, x[7].z));
    const uint4 d3 = make_uint4(PackF16x2(x[0].w, x[1].w), PackF16x2(x[2].w, x[3].w), PackF16x2(x[4].w, x[5].w),
                                PackF16x2(x[6].w, x[7].w));
    *reinterpret_cast<uint4*>(dst + wgmma::SwizzledOffset(4 * c + 0, b)) = d0;
    *reinterpret_cast<uint4*>(dst + wgmma::SwizzledOffset(4 * c + 1, b)) = d1;
    *reinterpret_cast<uint4*>(dst + wgmma::SwizzledOffset(4 * c + 2, b)) = d2;
    *reinterpret_cast<uint4*>(dst + wgmma::SwizzledOffset(4 * c + 3, b)) = d3;
  }
}

// The work: for each sequence of the tile items (its last item: the next item is of another
// sequence, or none), units (tile kt <= last position / 64, kv head, K or V), numbered across the
// sequences in item order; block b takes units b, b + gridDim.x, ... The items are walked in
// chunks of 256 (one per thread) with a block scan of their unit counts, so the grid depends only
// on the plan's counts and any number of items and contexts works.
constexpr int kConvertThreads = 256;
__global__ void __launch_bounds__(kConvertThreads)
KvTilesF16Kernel(const int32_t* __restrict__ items, int num_items, const int32_t* __restrict__ token_seq,
                 const int32_t* __restrict__ token_pos, PagedKv cache, int kvh, uint8_t* __restrict__ out) {
  PdlWaitForPrevious();  // pdl.cuh: the cache (appended by the step), positions and items are the step's
  PdlAllowNext();
  __shared__ int32_t ends[kConvertThreads];  // inclusive scan of the chunk's unit counts
  __shared__ int32_t warp_sums[kConvertThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, kvw = kvh * kHd;
  const int grid = static_cast<int>(gridDim.x);
  int done = 0;  // units of earlier chunks, modulo the grid
  for (int chunk = 0; chunk < num_items; chunk += kConvertThreads) {
    const int i = chunk + tid;
    int units = 0;
    if (i < num_items) {
      const int32_t first = items[2 * i], count = items[2 * i + 1];
      if (i + 1 == num_items || token_seq[items[2 * i + 2]] != token_seq[first]) {
        units = (token_pos[first + count - 1] / kKeys + 1) * kvh * 2;
      }
    }
    int x = units;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xFFFFFFFFu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    int before = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kConvertThreads / 32; ++w) {
      before += w < warp ? warp_sums[w] : 0;
      total += warp_sums[w];
    }
    ends[tid] = before + x;
    __syncthreads();
    for (int u = (static_cast<int>(blockIdx.x) - done % grid + grid) % grid; u < total; u += grid) {
      int lo = 0, hi = kConvertThreads - 1;  // the chunk's first entry whose end is past u
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (ends[mid] > u) hi = mid; else lo = mid + 1;
      }
      const int rel = u - (lo > 0 ? ends[lo - 1] : 0);
      const int part = rel & 1, kvhead = (rel >> 1) % kvh, kt = (rel >> 1) / kvh;
      const int item = chunk + lo;
      const int32_t first = items[2 * item], count = items[2 * item + 1];
      const int32_t max_pos = token_pos[first + count - 1];
      const int32_t page =
          cache.page_table[static_cast<int64_t>(token_seq[first]) * cache.max_pages + kt];
      const int valid = min(kKeys, max_pos - kt * kKeys + 1);
      uint8_t* dst = out + (static_cast<int64_t>(page) * kvh + kvhead) * kPageHeadBytes + part * kTileBytes;
      if (part == 0) {
        ConvertKTile(cache.k, page, kvhead, kvw, valid, dst, tid);
      } else {
        ConvertVTile(cache.v, page, kvhead, kvw, valid, dst, tid);
      }
    }
    done = (done + total % grid) % grid;
    __syncthreads();  // ends and warp_sums are rewritten by the next chunk
  }
}

// ---- The attention kernel over the f16 tiles ----

constexpr uint32_t kQOff = 0, kKOff = kQOff + kQBytes, kVOff = kKOff + 2 * kKBytes;
constexpr uint32_t kSmemBytes = kVOff + 2 * kVtBytes + 1024;  // + slack for the 1024-byte alignment
static_assert(kKOff % 1024 == 0 && kVOff % 1024 == 0 && kTileBytes % 1024 == 0, "aligned swizzle atoms");

// 16 bytes global -> shared bypassing L1, of which the first `bytes` (0 .. 16) are read and the
// rest zero-filled.
__device__ __forceinline__ void CpAsync16Partial(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

// This thread's chunks of one tile's K image into the K slab at k_dst: chunks tid + 256i, i < 8;
// K chunk L holds 8 dims of key (L % 512) / 8. Keys from `valid` on are zero-filled. No commit.
__device__ __forceinline__ void CopyK(const uint8_t* src, int valid, uint32_t k_dst, int tid) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t at = 16 * (tid + kThreads * i);
    CpAsync16Partial(k_dst + at, src + at, (tid >> 3) + 32 * (i & 1) < valid ? 16 : 0);
  }
}

// The same for the Vt image (at src + kTileBytes) into the Vt slab at v_dst: Vt chunk L holds keys
// 8b .. 8b + 7 of dim L / 8, b = (L % 8) ^ (L / 8 % 8), the same octet for all of the thread's
// chunks; keys from `valid` on are zero-filled. No commit.
__device__ __forceinline__ void CopyV(const uint8_t* src, int valid, uint32_t v_dst, int tid) {
  const int octet = (tid & 7) ^ ((tid >> 3) & 7);
  const int v_bytes = 2 * max(0, min(8, valid - 8 * octet));
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t at = 16 * (tid + kThreads * i);
    CpAsync16Partial(v_dst + at, src + kTileBytes + at, v_bytes);
  }
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// This thread's chunks of one tile (K and Vt), one cp.async group.
__device__ __forceinline__ void CopyTile(const uint8_t* src, int valid, uint32_t k_dst, uint32_t v_dst, int tid) {
  CopyK(src, valid, k_dst, tid);
  CopyV(src, valid, v_dst, tid);
  CpAsyncCommit();
}

__global__ void __launch_bounds__(kThreads, 1)
WgmmaKv16AttentionKernel(const float* __restrict__ q, const float* __restrict__ qg, int nh, int kvh,
                         const int32_t* __restrict__ items, const int32_t* __restrict__ token_seq,
                         const int32_t* __restrict__ token_pos, PagedKv cache, float* __restrict__ o, int splits,
                         float* __restrict__ part_o, float* __restrict__ part_ml) {
  PdlWaitForPrevious();  // pdl.cuh: q, the f16 tiles (KvTilesF16Kernel) and the items are the step's
  PdlAllowNext();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = attn_wg::AlignedSmem(smem_raw);
  const uint32_t base = SmemAddr(smem);
  __shared__ int32_t row_pos[kTcRows];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
  const TcBlock blk = BlockOf(nh, kvh, splits, items, token_seq, token_pos, cache);  // attention_tc_common.cuh
  const int kvhead = blk.kvhead, groups = blk.groups;
  const int32_t first = blk.first, count = blk.count, min_pos = blk.min_pos, max_pos = blk.max_pos;
  const int32_t* pages = blk.pages;
  const int kt_begin = blk.kt_begin, kt_end = blk.kt_end;
  if (kt_begin >= kt_end) return;  // an empty slice (short item): uniform over the block
  const uint8_t* tiles = static_cast<const uint8_t*>(cache.f16_tiles) + static_cast<int64_t>(kvhead) * kPageHeadBytes;
  const int64_t page_stride = static_cast<int64_t>(kvh) * kPageHeadBytes;
  auto copy_tile = [&](int kt, int32_t page, int buf) {
    CopyTile(tiles + page * page_stride, min(kKeys, max_pos - kt * kKeys + 1), base + kKOff + buf * kKBytes,
             base + kVOff + buf * kVtBytes, tid);
  };

  copy_tile(kt_begin, pages[kt_begin], 0);
  attn_wg::LoadRowPositions(row_pos, tid, groups, count, token_pos, first);
  attn_wg::LoadQ(smem, kQOff, q, first, count, groups, nh, kvhead, tid);
  __syncthreads();  // row_pos visible (Q and tile kt_begin: the loop's first barrier)

  const float scale_log2 = 1.4426950408889634f * rsqrtf(static_cast<float>(kHd));
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = wg * kWgRows + (warp & 3) * 16 + g;  // this thread's rows: row0 and row0 + 8
  const int32_t pos_lo = row_pos[row0], pos_hi = row_pos[row0 + 8];
  const uint32_t q_wg = base + kQOff + wg * kWgRows * 128;  // this warpgroup's 64 rows of each Q slab
  float acc[kHd / 2];  // n8 block nd (dims 8nd ..): acc[4nd], [4nd + 1] row0; [4nd + 2], [4nd + 3] row0 + 8
#pragma unroll
  for (int i = 0; i < kHd / 2; ++i) acc[i] = 0.0f;
  const auto accessor = [&acc](int nd, int c) -> float& { return acc[4 * nd + c]; };  // StoreRows' acc(nd, c)
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const int buf = (kt - kt_begin) & 1;
    const bool more = kt + 1 < kt_end;
    const int32_t next_page = more ? pages[kt + 1] : 0;  // read before the wait: its latency hides there
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // this thread's chunks of tile kt
    wgmma::FenceProxyAsync();  // the copies (and Q) for the wgmmas' async proxy
    __syncthreads();  // tile kt (and Q) visible; both warpgroups are done with tile kt - 1's buffers
    if (more) copy_tile(kt + 1, next_page, buf ^ 1);  // lands during all of tile kt

    float s[kKeys / 2];  // n8 block nb (keys 8nb ..): s[4nb + c] as acc
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.0f;
    attn_wg::IssueScores(s, q_wg, base + kKOff + buf * kKBytes);
    wgmma::Wait<0>();
    wgmma::FenceOperands(s);

    // Online softmax in base 2; masking only where the tile reaches past the first row's position.
    const bool mask = kt * kKeys + kKeys - 1 > min_pos;
    float corr[2];
    OnlineSoftmaxTile<kKeys>(s, m, l, corr, scale_log2, mask, kt * kKeys, t4, pos_lo, pos_hi);
    RescaleRows<kHd>(accessor, corr);
    uint32_t a[kKeys / 16][4];  // P as the register A fragments of its 4 k16 slices
    attn_wg::PackP(s, a);
    attn_wg::IssuePv(acc, a, base + kVOff + buf * kVtBytes);
    wgmma::Wait<0>();
    wgmma::FenceOperands(acc);
    attn_wg::KeepLive(a);  // the A registers stay untouched until the wgmmas reading them have completed
  }

  StoreRows<kHd>(accessor, m, l, row0, t4, blk, nh, kvh, splits, qg, o, part_o, part_ml);
}

// ---- The overlapped form (AttnKv16Mode() == 2) ----
//
// FlashAttention-3's intra-warpgroup overlap: in WgmmaKv16AttentionKernel a warpgroup's tensor cores
// idle during its online softmax (S(t) waited, O += P·V(t) not yet issued). Here each warpgroup
// issues S(t + 1) = Q·K(t + 1)^T before the softmax of tile t and waits for it only after issuing
// O += P·V(t), so the S wgmmas run during the softmax. Tile t's K and Vt slabs: (t − kt_begin) % 2.
//   Before the loop: group 1 = K(b) (b = kt_begin); group 2 = V(b), K(b + 1); S(b) issued, waited.
//   Iteration t, S(t) in registers:
//     wait for this thread's last group (V(t), K(t + 1)); barrier: both visible, and both
//       warpgroups have completed S(t) and O += P·V(t − 1), so K(t)'s and Vt(t − 1)'s slabs are free
//     issue S(t + 1) from K(t + 1)'s slab into the other S set (async)
//     copy K(t + 2) into K(t)'s slab and V(t + 1) into Vt(t − 1)'s slab (one group: lands during tile t)
//     online softmax of S(t), rescale O, P, issue O += P·V(t)
//     wait for both wgmma groups
// K is copied two tiles ahead, V one: two K and two Vt slabs suffice (the same 193 KiB), one
// barrier per tile. Every output element gets the same S wgmmas on the same bytes, the same
// softmax of the same S in tile order and the same P·V wgmmas into its accumulators in tile order:
// bit-identical to WgmmaKv16AttentionKernel. Two S sets (32 registers each): the loop is unrolled
// by two with their roles swapped, so S(t + 1) is never moved into the set the softmax reads.
__global__ void __launch_bounds__(kThreads, 1)
WgmmaKv16OverlapAttentionKernel(const float* __restrict__ q, const float* __restrict__ qg, int nh, int kvh,
                                const int32_t* __restrict__ items, const int32_t* __restrict__ token_seq,
                                const int32_t* __restrict__ token_pos, PagedKv cache, float* __restrict__ o,
                                int splits, float* __restrict__ part_o, float* __restrict__ part_ml) {
  PdlWaitForPrevious();  // pdl.cuh: q, the f16 tiles (KvTilesF16Kernel) and the items are the step's
  PdlAllowNext();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = attn_wg::AlignedSmem(smem_raw);
  const uint32_t base = SmemAddr(smem);
  __shared__ int32_t row_pos[kTcRows];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
  const TcBlock blk = BlockOf(nh, kvh, splits, items, token_seq, token_pos, cache);  // attention_tc_common.cuh
  const int kvhead = blk.kvhead, groups = blk.groups;
  const int32_t first = blk.first, count = blk.count, min_pos = blk.min_pos, max_pos = blk.max_pos;
  const int32_t* pages = blk.pages;
  const int kt_begin = blk.kt_begin, kt_end = blk.kt_end;
  if (kt_begin >= kt_end) return;  // an empty slice (short item): uniform over the block
  const uint8_t* tiles = static_cast<const uint8_t*>(cache.f16_tiles) + static_cast<int64_t>(kvhead) * kPageHeadBytes;
  const int64_t page_stride = static_cast<int64_t>(kvh) * kPageHeadBytes;
  auto valid = [&](int kt) { return min(kKeys, max_pos - kt * kKeys + 1); };
  auto k_slab = [&](int kt) { return base + kKOff + ((kt - kt_begin) & 1) * kKBytes; };
  auto v_slab = [&](int kt) { return base + kVOff + ((kt - kt_begin) & 1) * kVtBytes; };

  {
    const uint8_t* src = tiles + pages[kt_begin] * page_stride;
    CopyK(src, valid(kt_begin), k_slab(kt_begin), tid);
    CpAsyncCommit();
    CopyV(src, valid(kt_begin), v_slab(kt_begin), tid);
    if (kt_begin + 1 < kt_end) {
      CopyK(tiles + pages[kt_begin + 1] * page_stride, valid(kt_begin + 1), k_slab(kt_begin + 1), tid);
    }
    CpAsyncCommit();
  }
  attn_wg::LoadRowPositions(row_pos, tid, groups, count, token_pos, first);
  attn_wg::LoadQ(smem, kQOff, q, first, count, groups, nh, kvhead, tid);
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // this thread's chunks of K(kt_begin)
  wgmma::FenceProxyAsync();  // the copies and Q for the wgmmas' async proxy
  __syncthreads();           // Q, K(kt_begin) and row_pos visible

  const float scale_log2 = 1.4426950408889634f * rsqrtf(static_cast<float>(kHd));
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = wg * kWgRows + (warp & 3) * 16 + g;  // this thread's rows: row0 and row0 + 8
  const int32_t pos_lo = row_pos[row0], pos_hi = row_pos[row0 + 8];
  const uint32_t q_wg = base + kQOff + wg * kWgRows * 128;  // this warpgroup's 64 rows of each Q slab
  float acc[kHd / 2];  // n8 block nd (dims 8nd ..): acc[4nd], [4nd + 1] row0; [4nd + 2], [4nd + 3] row0 + 8
#pragma unroll
  for (int i = 0; i < kHd / 2; ++i) acc[i] = 0.0f;
  const auto accessor = [&acc](int nd, int c) -> float& { return acc[4 * nd + c]; };  // StoreRows' acc(nd, c)
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  float s0[kKeys / 2], s1[kKeys / 2];  // the two S sets: n8 block nb (keys 8nb ..): s[4nb + c] as acc
#pragma unroll
  for (int i = 0; i < kKeys / 2; ++i) s0[i] = 0.0f;
  attn_wg::IssueScores(s0, q_wg, k_slab(kt_begin));
  wgmma::Wait<0>();
  wgmma::FenceOperands(s0);

  // Tile kt with S(kt) in sc; S(kt + 1) into sn.
  auto step = [&](float (&sc)[kKeys / 2], float (&sn)[kKeys / 2], int kt) {
    const bool more = kt + 1 < kt_end, more2 = kt + 2 < kt_end;
    const int32_t page1 = more ? pages[kt + 1] : 0, page2 = more2 ? pages[kt + 2] : 0;  // before the wait
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // this thread's chunks of V(kt), K(kt + 1)
    wgmma::FenceProxyAsync();
    __syncthreads();  // V(kt), K(kt + 1) visible; both warpgroups are done with K(kt) and Vt(kt - 1)
    if (more) {
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) sn[i] = 0.0f;
      attn_wg::IssueScores(sn, q_wg, k_slab(kt + 1));  // runs during the softmax below
      CopyV(tiles + page1 * page_stride, valid(kt + 1), v_slab(kt + 1), tid);
    }
    if (more2) CopyK(tiles + page2 * page_stride, valid(kt + 2), k_slab(kt + 2), tid);
    CpAsyncCommit();  // (empty on the last tiles: the wait above then returns at once)

    // Online softmax in base 2; masking only where the tile reaches past the first row's position.
    const bool mask = kt * kKeys + kKeys - 1 > min_pos;
    float corr[2];
    OnlineSoftmaxTile<kKeys>(sc, m, l, corr, scale_log2, mask, kt * kKeys, t4, pos_lo, pos_hi);
    RescaleRows<kHd>(accessor, corr);
    uint32_t a[kKeys / 16][4];  // P as the register A fragments of its 4 k16 slices
    attn_wg::PackP(sc, a);
    attn_wg::IssuePv(acc, a, v_slab(kt));
    wgmma::Wait<0>();  // S(kt + 1) and O += P·V(kt)
    wgmma::FenceOperands(acc);
    if (more) wgmma::FenceOperands(sn);
    attn_wg::KeepLive(a);  // the A registers stay untouched until the wgmmas reading them have completed
  };
  int kt = kt_begin;
  for (; kt + 1 < kt_end; kt += 2) {
    step(s0, s1, kt);
    step(s1, s0, kt + 1);
  }
  if (kt < kt_end) step(s0, s1, kt);

  StoreRows<kHd>(accessor, m, l, row0, t4, blk, nh, kvh, splits, qg, o, part_o, part_ml);
}

// Blocks of the conversion: 2 per SM (queried once; 105 registers x 256 threads: 2 fit an SM).
unsigned ConvertBlocks() {
  static const unsigned blocks = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) {
      sms = 132;
    }
    return static_cast<unsigned>(2 * sms);
  }();
  return blocks;
}

}  // namespace

size_t AttnKv16ScratchBytes(const AttnShape& d, int64_t pages) {
  if (d.hd != kHd || d.kvh <= 0 || pages <= 0) return 0;
  return static_cast<size_t>(pages) * d.kvh * kPageHeadBytes;
}

cudaError_t LaunchWgmmaKv16Attention256(const float* q, const float* qg, const AttnShape& d,
                                        const int32_t* tile_items, int num_tile_items, unsigned blocks,
                                        const int32_t* token_seq, const int32_t* token_pos, const PagedKv& cache,
                                        float* o, cudaStream_t stream, int splits, float* part_o, float* part_ml,
                                        bool overlap) {
  if (d.hd != kHd || cache.f16_tiles == nullptr) return cudaErrorInvalidValue;
  if (num_tile_items <= 0) return cudaSuccess;
  // Above 48 KiB a kernel needs the opt-in; done once per kernel (thread-safe statics).
  static const cudaError_t attribute = cudaFuncSetAttribute(
      WgmmaKv16AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
  static const cudaError_t attribute_ovl = cudaFuncSetAttribute(
      WgmmaKv16OverlapAttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
  if (attribute != cudaSuccess) return attribute;
  if (attribute_ovl != cudaSuccess) return attribute_ovl;
  if (cudaError_t e = LaunchPrefillPdl(KvTilesF16Kernel, ConvertBlocks(), kConvertThreads, 0, stream, tile_items,
                                       num_tile_items, token_seq, token_pos, cache, d.kvh,
                                       static_cast<uint8_t*>(cache.f16_tiles));
      e != cudaSuccess) {
    return e;
  }
  return LaunchPrefillPdl(overlap ? WgmmaKv16OverlapAttentionKernel : WgmmaKv16AttentionKernel, blocks, kThreads,
                          kSmemBytes, stream, q, qg, d.nh, d.kvh, tile_items, token_seq, token_pos, cache, o, splits,
                          part_o, part_ml);
}

}  // namespace tandem::cuda
