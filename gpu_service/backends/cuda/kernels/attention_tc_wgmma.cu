// The wgmma variant of the hd-256 tensor-core prefill attention (AttnTcWgmma(), attention.cuh):
// the pipelined kernel's tile items, plan, staging, masks, online softmax and outputs
// (attention_tc.cu), with Hopper's warpgroup MMA instead of per-warp mma.sync. At head dim 256
// the mma.sync kernel is bound by the ldmatrix traffic of its K/V fragments (~165 TFLOP/s on the
// H200); wgmma reads its B operand (and here Q as well) straight from shared memory.
//
// Block of 2 warpgroups per (tile item, kv head, slice), warpgroup wg owning the block's query
// rows 64wg .. 64wg + 63 (kTcRows = 128, rows as in the pipelined kernel). Shared memory, from a
// 1024-byte aligned base (the swizzle atoms must be):
//   stage  64 KiB  one f32 K or V tile (64 keys x 256), landed by cp.async
//   Q      64 KiB  f16, K-major 128-byte swizzle (wgmma_f16.cuh): 4 slabs of 64 head dims, each
//                  128 rows x 128 B; converted once
//   K      32 KiB  f16 K tile, the same layout: 4 slabs of 64 keys x 128 B
//   Vt     32 KiB  f16 V tile transposed, [256 dims][64 keys]: one slab of 256 rows x 128 B, so
//                  O += P·V's B operand (k = keys) is K-major like the others (no transpose flag)
// S = Q·K^T: 16 wgmma m64n64k16, A = Q and B = K from shared memory. The accumulator layout is
// mma.sync's per warp (thread: rows g, g + 8 of its warp's 16), so the softmax is the old
// kernel's, and n8 blocks 2kk, 2kk + 1 of S converted to f16 are the register A fragment of k16
// slice kk of P. O += P·V: 4 wgmma m64n256k16 with A = P from registers into 128 f32 accumulators.
//
// Each thread converts only the stage slots it copied itself (no barrier between its cp.async
// wait and the conversion). K is staged key-major (a warp: 512 contiguous bytes of one key) and
// stored as 8-byte pieces; V is staged so that a thread holds 8 consecutive keys of 4 dims twice
// and stores each dim's 8 keys as one 16-byte chunk of Vt. Both mappings keep the cp.async,
// stage reads and swizzled stores free of bank conflicts (the V stage slots are XOR-swizzled by
// key octet for that). The pipeline is the old kernel's: V(t) lands during S(t), K(t+1) during the
// softmax and O += P·V(t); in addition V(t) is converted while the tensor cores run S(t), and
// K(t+1) while they run O += P·V(t).
#include <cuda_fp16.h>

#include "gpu_service/backends/cuda/kernels/attention_tc.cuh"
#include "gpu_service/backends/cuda/kernels/attention_tc_common.cuh"
#include "gpu_service/backends/cuda/kernels/attention_tc_wgmma.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/wgmma_f16.cuh"

namespace tandem::cuda {
namespace {

using attn_tc::BlockOf;
using attn_tc::CpAsync16OrZero;
using attn_tc::OnlineSoftmaxTile;
using attn_tc::RescaleRows;
using attn_tc::StoreRows;
using attn_tc::TcBlock;

using attn_wg::KeepLive;
using attn_wg::kHd;
using attn_wg::kKeys;
using attn_wg::kKSlab;
using attn_wg::kQSlab;
using attn_wg::kThreads;
using attn_wg::kWgRows;
using attn_wg::StoreF16x4;
using attn_wg::SwizzledQuad;

constexpr uint32_t kStageBytes = sizeof(float) * kKeys * kHd;
constexpr uint32_t kQOff = kStageBytes, kKOff = kQOff + attn_wg::kQBytes, kVOff = kKOff + attn_wg::kKBytes;
constexpr uint32_t kSmemBytes = kVOff + attn_wg::kVtBytes + 1024;  // + slack for the 1024-byte alignment
static_assert(kQOff % 1024 == 0 && kKOff % 1024 == 0 && kVOff % 1024 == 0, "aligned swizzle atoms");

// K: thread tid copies float4 column c = tid % 64 of keys j0 + 4i (j0 = tid / 64, i < 16): a warp
// reads 512 contiguous bytes of one key. Stage slot (key j, column c) = j·64 + c. Keys from
// valid_keys on are zero-filled (unwritten cache may hold NaN).
__device__ __forceinline__ void StageK(const float* pool, int32_t page, int kvhead, int kvw, int valid_keys,
                                       uint32_t stage, int tid) {
  const int c = tid & 63, j0 = tid >> 6;
  const float* src = pool + (static_cast<int64_t>(page) * kKvPageSize + j0) * kvw + kvhead * kHd + 4 * c;
  const uint32_t dst = stage + (j0 * 64 + c) * 16;
#pragma unroll
  for (int i = 0; i < kKeys / 4; ++i) {
    CpAsync16OrZero(dst + i * 4 * 64 * 16, src, j0 + 4 * i < valid_keys);
    src += 4 * kvw;
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits for this thread's K share and stores it as f16 rows of the swizzled K tile.
__device__ __forceinline__ void ConvertK(uint8_t* smem, int tid) {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  const int c = tid & 63, j0 = tid >> 6;
  const float4* stage = reinterpret_cast<const float4*>(smem);
#pragma unroll
  for (int i = 0; i < kKeys / 4; ++i) {
    const int j = j0 + 4 * i;
    StoreF16x4(smem, kKOff + SwizzledQuad(j, c, kKSlab), stage[j * 64 + c]);
  }
}

// V: thread tid takes float4 column c = (tid & 1) | (tid >> 3) << 1 of key octets b = b0 and b0 + 4
// (b0 = (tid >> 1) & 3), all 8 keys of each: a quarter-warp covers 2 columns x 4 octets, so each
// key row is read 32 contiguous bytes at a time (whole sectors). Stage slot (key j, column c) =
// j·64 + (c ^ 2·(j / 8)): the quarter-warp's 8 slots fall on distinct banks.
__device__ __forceinline__ int VColumn(int tid) { return (tid & 1) | ((tid >> 3) << 1); }
__device__ __forceinline__ void StageV(const float* pool, int32_t page, int kvhead, int kvw, int valid_keys,
                                       uint32_t stage, int tid) {
  const int c = VColumn(tid), b0 = (tid >> 1) & 3;
  const float* src = pool + static_cast<int64_t>(page) * kKvPageSize * kvw + kvhead * kHd + 4 * c;
#pragma unroll
  for (int o = 0; o < 2; ++o) {
    const int b = b0 + 4 * o;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int j = 8 * b + k;
      CpAsync16OrZero(stage + (j * 64 + (c ^ (b << 1))) * 16, src + static_cast<int64_t>(j) * kvw, j < valid_keys);
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits for this thread's V share and stores, for each of its 4 dims and 2 octets, the 8 keys as
// one 16-byte chunk of Vt (row = dim, chunk = octet; the quarter-warp's chunks are distinct banks).
__device__ __forceinline__ void ConvertV(uint8_t* smem, int tid) {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  const int c = VColumn(tid), b0 = (tid >> 1) & 3;
  const float4* stage = reinterpret_cast<const float4*>(smem);
#pragma unroll
  for (int o = 0; o < 2; ++o) {
    const int b = b0 + 4 * o;
    float4 x[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = stage[(8 * b + k) * 64 + (c ^ (b << 1))];
    const uint4 d0 = make_uint4(PackF16x2(x[0].x, x[1].x), PackF16x2(x[2].x, x[3].x), PackF16x2(x[4].x, x[5].x),
                                PackF16x2(x[6].x, x[7].x));
    const uint4 d1 = make_uint4(PackF16x2(x[0].y, x[1].y), PackF16x2(x[2].y, x[3].y), PackF16x2(x[4].y, x[5].y),
                                PackF16x2(x[6].y, x[7].y));
    const uint4 d2 = make_uint4(PackF16x2(x[0].z, x[1].z), PackF16x2(x[2].z, x[3].z), PackF16x2(x[4].z, x[5].z),
                                PackF16x2(x[6].z, x[7].z));
    const uint4 d3 = make_uint4(PackF16x2(x[0].w, x[1].w), PackF16x2(x[2].w, x[3].w), PackF16x2(x[4].w, x[5].w),
                                PackF16x2(x[6].w, x[7].w));
    *reinterpret_cast<uint4*>(smem + kVOff + wgmma::SwizzledOffset(4 * c + 0, b)) = d0;
    *reinterpret_cast<uint4*>(smem + kVOff + wgmma::SwizzledOffset(4 * c + 1, b)) = d1;
    *reinterpret_cast<uint4*>(smem + kVOff + wgmma::SwizzledOffset(4 * c + 2, b)) = d2;
    *reinterpret_cast<uint4*>(smem + kVOff + wgmma::SwizzledOffset(4 * c + 3, b)) = d3;
  }
}

__global__ void __launch_bounds__(kThreads, 1)
WgmmaTensorCoreAttentionKernel(const float* __restrict__ q, const float* __restrict__ qg, int nh, int kvh,
                               const int32_t* __restrict__ items, const int32_t* __restrict__ token_seq,
                               const int32_t* __restrict__ token_pos, PagedKv cache, float* __restrict__ o,
                               int splits, float* __restrict__ part_o, float* __restrict__ part_ml) {
  PdlWaitForPrevious();  // pdl.cuh: q, the cache and the items are the step's
  PdlAllowNext();
  extern __shared__ uint8_t smem_raw[];
  // attn_wg::AlignedSmem and LoadRowPositions (below) written out: calling them reschedules this
  // kernel's SASS (nvcc 13, checked 2026-12-02), and this is the measured, bit-tested code.
  uint8_t* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  const uint32_t base = SmemAddr(smem);  // the stage is at offset 0
  __shared__ int32_t row_pos[kTcRows];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
  const TcBlock blk = BlockOf(nh, kvh, splits, items, token_seq, token_pos, cache);  // attention_tc_common.cuh
  const int kvhead = blk.kvhead, groups = blk.groups, kvw = kvh * kHd;
  const int32_t first = blk.first, count = blk.count, min_pos = blk.min_pos, max_pos = blk.max_pos;
  const int32_t* pages = blk.pages;
  const int kt_begin = blk.kt_begin, kt_end = blk.kt_end;
  if (kt_begin >= kt_end) return;  // an empty slice (short item): uniform over the block
  auto valid_keys = [&](int kt) { return min(kKeys, max_pos - kt * kKeys + 1); };

  StageK(cache.k, pages[kt_begin], kvhead, kvw, valid_keys(kt_begin), base, tid);
  if (tid < kTcRows) row_pos[tid] = tid / groups < count ? token_pos[first + tid / groups] : -1;
  attn_wg::LoadQ(smem, kQOff, q, first, count, groups, nh, kvhead, tid);
  ConvertK(smem, tid);
  wgmma::FenceProxyAsync();  // Q and K(0), written by this thread, for the wgmmas' async proxy
  __syncthreads();           // Q, K(0) and row_pos visible; the staging area is free again
  StageV(cache.v, pages[kt_begin], kvhead, kvw, valid_keys(kt_begin), base, tid);

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
    const bool more = kt + 1 < kt_end;
    const int32_t next_page = more ? pages[kt + 1] : 0;  // read early: its latency hides behind S
    float s[kKeys / 2];  // n8 block nb (keys 8nb ..): s[4nb + c] as acc
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.0f;
    attn_wg::IssueScores(s, q_wg, base + kKOff);
    // V(kt) into Vt while the tensor cores run S: Vt(kt - 1) is free (both warpgroups waited for
    // their O += P·V before the last barrier) and S reads only Q and K.
    ConvertV(smem, tid);
    wgmma::FenceProxyAsync();  // for O += P·V's async reads
    wgmma::Wait<0>();
    wgmma::FenceOperands(s);
    __syncthreads();  // V(kt) visible; both warpgroups are done with K(kt) and the stage
    if (more) StageK(cache.k, next_page, kvhead, kvw, valid_keys(kt + 1), base, tid);

    // Online softmax in base 2; masking only where the tile reaches past the first row's position.
    const bool mask = kt * kKeys + kKeys - 1 > min_pos;
    float corr[2];
    OnlineSoftmaxTile<kKeys>(s, m, l, corr, scale_log2, mask, kt * kKeys, t4, pos_lo, pos_hi);
    RescaleRows<kHd>(accessor, corr);
    uint32_t a[kKeys / 16][4];  // P as the register A fragments of its 4 k16 slices
    attn_wg::PackP(s, a);
    attn_wg::IssuePv(acc, a, base + kVOff);
    if (more) {
      // K(kt + 1) into K while the tensor cores run O += P·V: both warpgroups' S(kt) completed
      // before the last barrier, and O += P·V reads only Vt.
      ConvertK(smem, tid);
      wgmma::FenceProxyAsync();  // for the next S's async reads
    }
    wgmma::Wait<0>();
    wgmma::FenceOperands(acc);
    KeepLive(a);  // the A registers stay untouched until the wgmmas reading them have completed
    if (more) {
      __syncthreads();  // K(kt + 1) visible; both warpgroups are done with Vt(kt) and the stage
      StageV(cache.v, next_page, kvhead, kvw, valid_keys(kt + 1), base, tid);
    }
  }

  StoreRows<kHd>(accessor, m, l, row0, t4, blk, nh, kvh, splits, qg, o, part_o, part_ml);
}

}  // namespace

cudaError_t LaunchWgmmaTensorCoreAttention256(const float* q, const float* qg, const AttnShape& d,
                                              const int32_t* tile_items, unsigned blocks, const int32_t* token_seq,
                                              const int32_t* token_pos, const PagedKv& cache, float* o,
                                              cudaStream_t stream, int splits, float* part_o, float* part_ml) {
  if (d.hd != kHd) return cudaErrorInvalidValue;
  // Above 48 KiB a kernel needs the opt-in; done once (thread-safe static).
  static const cudaError_t attribute = cudaFuncSetAttribute(
      WgmmaTensorCoreAttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
  if (attribute != cudaSuccess) return attribute;
  return LaunchPrefillPdl(WgmmaTensorCoreAttentionKernel, blocks, kThreads, kSmemBytes, stream, q, qg, d.nh, d.kvh,
                          tile_items, token_seq, token_pos, cache, o, splits, part_o, part_ml);
}

}  // namespace tandem::cuda
