// PrefillKernel::kMmqLean2: kMmqLean (expert_prefill_mmq_lean.cu) with its per-unit and per-tile
// latency steps taken off the critical path; the same units, rings, super-block body and stores, so
// the same integer sums and the same f32 order: outputs bit-identical to kMmqLean's.
// Written blind (branch h/lean2), measured on the H200 on 2026-12-01 (seventh session): bits equal
// to kMmqLean's, expert_prefill_bench at 2048 tokens 1.21 -> 1.08-1.11 ms a layer, end to end
// prefill 512 13874 -> 14621 tok/s. The default for small groups since (TANDEM_PREFILL_MMQ=7 for
// kMmqLean).
//
// Why (PERF_NOTES.md, "512-token lean variants": Nsight Compute on kMmqLean at 512 tokens): the
// kernel is latency-bound (4 warps a scheduler, ~1 eligible, IPC 0.55); besides the spills, the
// long-scoreboard and barrier stalls come from
//  - the producer reading the unit's tile descriptor from global right before it computes the
//    unit's copy addresses (every unit: 2 super-blocks of the down kernel, 8 of gate/up);
//  - the tile switch (every 4 gate/up units, 8 down units): three __syncthreads and a chain of
//    dependent global round trips (descriptor -> slot index -> s_row in shared -> activation rows
//    through registers -> scales -> sums).
// Here:
//  - the producer holds the weight pointers of its NEXT unit's tile in registers, loaded one unit
//    ahead (a load whose result is used KB super-blocks later);
//  - a tile's activation rows, scales and sums go global -> shared by cp.async (no registers, no
//    s_row: lane l of every warp holds the row index of slot l % 16 and the copies take it by
//    shuffle), all issued at once; each thread turns the sums it copied itself into the min term's
//    tf32 operands (RoundTf32, the same values as kMmqLean's) before the barrier that publishes them;
//  - where two tiles' activations fit beside the ring (K <= 1024: the down kernel at the 80B shapes,
//    2 x 19.4 KB), they are double-buffered: the next tile's copies are issued right after the
//    barrier that starts the current tile and ride in the ring's cp.async groups, so a tile switch
//    is ONE __syncthreads with nothing to load after it; single-buffered (gate/up, K = 2048: 2 x 77 KB
//    does not fit beside the 147 KB ring), a switch is two __syncthreads with one round trip between,
//    the tile's slot rows having been read at the previous switch;
//  - K compiled in for the 80B shapes (gate/up 2048, down 512; other K from the argument): with the
//    stage counters derived from the item index, the steady-state super-block has no spill reload
//    left (kMmqLean: 3) and ~8% fewer instructions (PERF_NOTES.md, "kMmqLean2").
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"
#include "gpu_service/backends/cuda/moe/mmq_device.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace prefill_mmq_lean2 {
namespace {

constexpr int kQ4KBlockBytes = 144;
constexpr int kStageBytes = 16 * kQ4KBlockBytes;  // one super-block of 16 rows: 2304 bytes
constexpr int kStageChunks = kStageBytes / 16;      // 144 copies of 16 bytes: 4 per lane + 1 for lanes < 16
constexpr int kNB = 2;                              // n8 blocks of a tile
constexpr int kT = 8 * kNB;                         // slots of a tile
constexpr int kSmemLimit = 227 * 1024;
static_assert(kStageChunks == 4 * 32 + 16, "the producer's lane layout assumes 144 chunks");

// Bytes of one slot's activation row in shared memory: per sub-block 32 bytes of hi then 32 of lo,
// plus 16 so that consecutive rows start in different 16-byte bank groups (as kMmqLean).
__host__ __device__ constexpr int RowStride(int K) { return 2 * K + 16; }

// One tile buffer: activations [kT][RowStride], scales [KB][kT] f32, the min term's tf32 B operands
// [KB][kNB][32] float4, and their raw sums [KB][kNB][32] float2 as cp.async left them.
__host__ __device__ constexpr int ScaleOffset(int K) { return kT * RowStride(K); }
__host__ __device__ constexpr int MinOffset(int K) { return ScaleOffset(K) + kT * (K / 256) * 4; }
__host__ __device__ constexpr int RawOffset(int K) { return MinOffset(K) + (K / 256) * kNB * 32 * 16; }
__host__ __device__ constexpr int BufferBytes(int K) { return RawOffset(K) + (K / 256) * kNB * 32 * 8; }
static_assert(BufferBytes(256) % 16 == 0, "buffers stay 16-byte aligned");

using mmq_device::LdMatrixX4S;
using mmq_device::MmaS8;
using mmq_device::MmaTf32;
using mmq_device::RoundTf32;

// Shared-memory reads by 32-bit address (volatile: they must stay after the ring's wait).
__device__ __forceinline__ uint4 LdShared128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ float2 LdShared64F(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

// 4 bytes global -> shared (the scales and sums: single floats at scattered addresses).
__device__ __forceinline__ void CpAsync4(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr), "l"(gmem) : "memory");
}

__device__ __forceinline__ int ByteOf(uint32_t w, int i) { return static_cast<int>(__byte_perm(w, 0u, 0x4440u + i)); }

__device__ __forceinline__ float MinAsFloat(uint32_t w, int t) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u + static_cast<unsigned>(t))) - 8388608.0f;
}

__device__ __forceinline__ float SiluTimes(float g, float u) { return g * (1.0f / (1.0f + expf(-g))) * u; }

// A tile's slot range and, in lane l of every warp, the row of `a` of slot l % 16 (clamped to the
// last slot for l % 16 >= rows, so that every lane reads a valid index).
struct TileRows {
  int first_slot;
  int rows;
  int row_of_lane;
};

__device__ __forceinline__ TileRows ReadTileRows(const PrefillTile* tiles, int tile_index,
                                                 const int32_t* __restrict__ a_index, int lane) {
  const int2 fr = *reinterpret_cast<const int2*>(&tiles[tile_index].first_slot);  // {first_slot, rows}
  const int slot = fr.x + min(lane & 15, fr.y - 1);
  return TileRows{fr.x, fr.y, a_index != nullptr ? a_index[slot] : slot};
}

// Issues the cp.async copies of tile `tr`'s rows, scales and sums into the buffer at shared address
// buf (no commit). Every thread of the block calls it (the shuffles need whole warps); entry i of
// each kind belongs to thread i % kThreads, which ConvertSums relies on.
template <int kThreads>
__device__ __forceinline__ void IssueTileCopies(const TileRows& tr, const MmqActivations& a, int K, uint32_t buf,
                                                int tid) {
  const int KB = K >> 8, RS = RowStride(K), chunks = K >> 4;
  // Activations: chunk c (16 bytes of hi and of lo) of row r into [hi 32 B | lo 32 B] per sub-block.
  for (int i0 = 0; i0 < kT * chunks; i0 += kThreads) {
    const int i = i0 + tid, r = i / chunks, c = i - r * chunks;
    const int64_t row = __shfl_sync(0xFFFFFFFFu, tr.row_of_lane, r & 15);
    if (r < tr.rows) {
      const int64_t off = row * K + c * 16;
      const uint32_t dst = buf + static_cast<uint32_t>(r * RS + (c >> 1) * 64 + (c & 1) * 16);
      CpAsync16(dst, a.hi + off);
      CpAsync16(dst + 32, a.lo + off);
    }
  }
  // Scales [KB][kT].
  for (int i0 = 0; i0 < kT * KB; i0 += kThreads) {
    const int i = i0 + tid, r = i / KB, b = i - r * KB;
    const int64_t row = __shfl_sync(0xFFFFFFFFu, tr.row_of_lane, r & 15);
    if (r < tr.rows) CpAsync4(buf + ScaleOffset(K) + (b * kT + r) * 4, a.scale + row * KB + b);
  }
  // Raw sums, entry (sb, nb, lane l) = sumx of sub-blocks 8·sb + l % 4 and 8·sb + l % 4 + 4 for
  // slot 8·nb + l / 4 (kMmqLean's s_min entries before the tf32 split).
  const int subs = K >> 5;
  for (int i0 = 0; i0 < KB * kNB * 32; i0 += kThreads) {
    const int i = i0 + tid;
    const int l = i & 31, nb = (i >> 5) % kNB, sbi = (i >> 5) / kNB;
    const int r = 8 * nb + (l >> 2);
    const int64_t row = __shfl_sync(0xFFFFFFFFu, tr.row_of_lane, r & 15);
    if (i < KB * kNB * 32 && r < tr.rows) {
      const float* sx = a.sumx + row * subs + sbi * 8 + (l & 3);
      const uint32_t dst = buf + RawOffset(K) + i * 8;
      CpAsync4(dst, sx);
      CpAsync4(dst + 4, sx + 4);
    }
  }
}

// The raw sums this thread copied (its copies complete: after its cp.async wait) -> the min term's
// B operands {tf32(v0), tf32(v1), v0 - tf32(v0), v1 - tf32(v1)}, kMmqLean's values. Entries of
// slots past the tile's rows hold stale values, as in kMmqLean: they only reach those slots' output
// columns, which are never stored.
template <int kThreads>
__device__ __forceinline__ void ConvertSums(uint8_t* buf, int K, int tid) {
  const int KB = K >> 8;
  const float2* raw = reinterpret_cast<const float2*>(buf + RawOffset(K));
  float4* mins = reinterpret_cast<float4*>(buf + MinOffset(K));
  for (int i = tid; i < KB * kNB * 32; i += kThreads) {
    const float2 v = raw[i];
    const float h0 = RoundTf32(v.x), h1 = RoundTf32(v.y);
    mins[i] = make_float4(h0, h1, v.x - h0, v.y - h1);
  }
}

// As prefill_mmq_lean::MmqLeanKernel; kDouble: two tile buffers (BufferBytes(K) each) beside the ring;
// kFixedK: K known at compile time (the 80B shapes: 2048 gate/up, 512 down; 0: K from the argument),
// which turns the row stride, the buffer offsets and the weight row pitch into immediates and frees
// their registers under the 128-register cap.
template <bool kGateUp, int kWarps, int kStages, bool kDouble, int kFixedK>
__global__ void __launch_bounds__(kWarps * 32, 1)
    MmqLean2Kernel(const PrefillTile* __restrict__ tiles, int num_tiles, MmqActivations a,
                   const int32_t* __restrict__ a_index, int k_arg, int N, int out_cols, float* __restrict__ out,
                   const int* __restrict__ tile_count) {
  PdlWaitForPrevious();  // pdl.cuh: the tiles, their count and the activations are the step's
  PdlAllowNext();
  const int K = kFixedK != 0 ? kFixedK : k_arg;
  if (tile_count != nullptr) num_tiles = min(num_tiles, *tile_count);
  static_assert((kStages & (kStages - 1)) == 0, "ring stages: a power of two");
  constexpr int kThreads = kWarps * 32;
  constexpr int kUnitRows = 16 * kWarps;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int KB = static_cast<int>(static_cast<unsigned>(K) >> 8);
  const int RS = RowStride(K);
  const int64_t row_bytes = static_cast<int64_t>(KB) * kQ4KBlockBytes;
  const int units_per_tile = N / kUnitRows;
  const int64_t units = static_cast<int64_t>(num_tiles) * units_per_tile;
  const int64_t u_begin = units * blockIdx.x / gridDim.x, u_end = units * (blockIdx.x + 1) / gridDim.x;
  // A device-planned launch may have more blocks than units (the grid was sized by the bound).
  if (u_begin == u_end) return;
  const int total = static_cast<int>(u_end - u_begin) * KB;  // items of every warp
  const int last_tile = static_cast<int>((u_end - 1) / units_per_tile);

  constexpr int kBuffers = kDouble ? 2 : 1;
  const int buf_bytes = BufferBytes(K);
  const uint32_t smem_addr = SmemAddr(smem);
  const uint32_t ring_addr = smem_addr + kBuffers * buf_bytes + warp * kStages * kStageBytes;

  // ---- Producer (per lane), as kMmqLean; the weight pointers of the tile of its next unit are
  // loaded one unit ahead (nx_*), so setup_unit does not wait on a global load.
  int p_tile = static_cast<int>(u_begin / units_per_tile);
  int p_chunk = static_cast<int>(u_begin % units_per_tile);
  int p_sb = 0;
  const uint8_t* nx_a;  // gate, or down
  const uint8_t* nx_b;  // up (gate/up only)
  if constexpr (kGateUp) {
    nx_a = static_cast<const uint8_t*>(tiles[p_tile].gate);
    nx_b = static_cast<const uint8_t*>(tiles[p_tile].up);
  } else {
    nx_a = static_cast<const uint8_t*>(tiles[p_tile].down);
    nx_b = nullptr;
  }
  const uint8_t* src[5];
  auto setup_unit = [&] {
#pragma unroll
    for (int j = 0; j < 5; ++j) {
      const int q = j < 4 ? lane + 32 * j : 128 + (lane & 15);
      const int r = q / 9, piece = q % 9;
      if constexpr (kGateUp) {
        const int f = p_chunk * (kUnitRows / 2) + warp * 8 + (r & 7);
        src[j] = (r < 8 ? nx_a : nx_b) + f * row_bytes + piece * 16;
      } else {
        const int n = p_chunk * kUnitRows + warp * 16 + r;
        src[j] = nx_a + n * row_bytes + piece * 16;
      }
    }
    // The next unit's tile: the same one, or the next (whose pointers are needed KB super-blocks on).
    if (p_chunk + 1 == units_per_tile && p_tile + 1 <= last_tile) {
      if constexpr (kGateUp) {
        nx_a = static_cast<const uint8_t*>(tiles[p_tile + 1].gate);
        nx_b = static_cast<const uint8_t*>(tiles[p_tile + 1].up);
      } else {
        nx_a = static_cast<const uint8_t*>(tiles[p_tile + 1].down);
      }
    }
  };
  auto issue = [&](int f) {
    if (f < total) {
      if (p_sb == 0) setup_unit();
      // Item f's ring stage is f mod kStages (f: a uniform register; no per-warp stage counter).
      const uint32_t dst = ring_addr + (f & (kStages - 1)) * kStageBytes + lane * 16;
      const int off = p_sb * kQ4KBlockBytes;
#pragma unroll
      for (int j = 0; j < 4; ++j) CpAsync16(dst + 512 * j, src[j] + off);
      if (lane < 16) CpAsync16(dst + 2048, src[4] + off);
      if (++p_sb == KB) {
        p_sb = 0;
        if (++p_chunk == units_per_tile) {
          p_chunk = 0;
          ++p_tile;
        }
      }
    }
    CpAsyncCommit();  // empty groups past the end keep the wait count uniform
  };

  // ---- Consumer, as kMmqLean; the current tile's buffer is at cur (shared address).
  int c_tile = static_cast<int>(u_begin / units_per_tile);
  int c_chunk = static_cast<int>(u_begin % units_per_tile);
  int c_sb = 0;
  int rows = 0, nbs = 0, first_slot = 0;
  float acc[kNB][4];
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nb][e] = 0.0f;
  }
  const uint32_t a_off =
      static_cast<uint32_t>(((lane & 7) + 8 * ((lane >> 3) & 1)) * kQ4KBlockBytes + 16 + 16 * (lane >> 4));
  // Lane parts of the B addresses (kMmqLean's b2_base / b1_base less the buffer's address).
  const uint32_t b2_lane = static_cast<uint32_t>(((lane & 7) + 8 * (lane >> 4)) * RS + 16 * ((lane >> 3) & 1));
  const uint32_t b1_lane = static_cast<uint32_t>((lane & 7) * RS + 16 * ((lane >> 3) & 1) + 32 * (lane >> 4));
  uint32_t cur = smem_addr;

  // The next tile's slot rows (double-buffered: the tile staged in the other buffer) and the item
  // whose ring group carries its copies.
  TileRows staged{0, 0, 0};
  int staged_f = -kStages;
  if constexpr (kDouble) {
    staged = ReadTileRows(tiles, c_tile, a_index, lane);
    IssueTileCopies<kThreads>(staged, a, K, smem_addr, tid);
    CpAsyncCommit();  // older than the ring's first groups: complete at the first ring wait
  }

  // Tile switch to c_tile (block-uniform: every warp reaches it at the same item f).
  auto switch_tile = [&](int f) {
    if constexpr (kDouble) {
      // c_tile's copies were issued at item staged_f; the ring wait of item f covers the groups of
      // items <= f - (kStages - 1) only.
      if (f - staged_f < kStages - 1) CpAsyncWait<0>();
      const int b = (c_tile - static_cast<int>(u_begin / units_per_tile)) & 1;
      cur = smem_addr + b * buf_bytes;
      ConvertSums<kThreads>(smem + b * buf_bytes, K, tid);
      rows = staged.rows;
      first_slot = staged.first_slot;
      const bool more = c_tile + 1 <= last_tile;
      if (more) staged = ReadTileRows(tiles, c_tile + 1, a_index, lane);  // in flight over the barrier
      __syncthreads();  // c_tile's buffer complete and visible; every warp is done with the other one
      if (more) {
        IssueTileCopies<kThreads>(staged, a, K, smem_addr + (b ^ 1) * buf_bytes, tid);  // the next issue commits
        staged_f = f;
      }
    } else {
      // c_tile's slot rows were read at the previous switch (staged; the first tile's at the start).
      if (f == 0) staged = ReadTileRows(tiles, c_tile, a_index, lane);
      __syncthreads();  // every warp is done with the previous tile's buffer
      IssueTileCopies<kThreads>(staged, a, K, smem_addr, tid);
      CpAsyncCommit();
      rows = staged.rows;
      first_slot = staged.first_slot;
      // The next tile's slot rows, in flight over this tile (3 registers).
      if (c_tile + 1 <= last_tile) staged = ReadTileRows(tiles, c_tile + 1, a_index, lane);
      CpAsyncWait<0>();  // also the ring's pending stages, issued one and two super-blocks ago
      ConvertSums<kThreads>(smem, K, tid);
      __syncthreads();
    }
    nbs = (rows + 7) >> 3;
  };

  // One super-block of the warp's 16 rows against NBS n8 blocks of slots: kMmqLean's body, with the
  // tile buffer's address cur.
  auto super_block = [&](auto nbs_constant, int f) {
    constexpr int NBS = decltype(nbs_constant)::value;
    const uint32_t st = ring_addr + (f & (kStages - 1)) * kStageBytes;
    float d64[2], dmin[2];
    uint32_t scw[2][2], mw[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 head = LdShared128(st + (g + 8 * h) * kQ4KBlockBytes);
      const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&head.x));
      d64[h] = dd.x * (1.0f / 64);
      dmin[h] = dd.y;
      scw[h][0] = head.y & 0x3F3F3F3Fu;
      mw[h][0] = head.z & 0x3F3F3F3Fu;
      scw[h][1] = (head.w & 0x0F0F0F0Fu) | ((head.y >> 2) & 0x30303030u);
      mw[h][1] = ((head.w >> 4) & 0x0F0F0F0Fu) | ((head.z >> 2) & 0x30303030u);
    }
    int iacc[NBS][4];
#pragma unroll
    for (int nb = 0; nb < NBS; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) iacc[nb][e] = 0;
    }
    const uint32_t b_sb = cur + (NBS == 2 ? b2_lane : b1_lane) + c_sb * 512;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      uint32_t q[4];
      LdMatrixX4S(q, st + a_off + 32 * p);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * p + half;
        uint32_t af[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) af[i] = (half == 0 ? q[i] : q[i] >> 4) & 0x0F0F0F0Fu;
        const int sc[2] = {ByteOf(scw[0][j >> 2], j & 3), ByteOf(scw[1][j >> 2], j & 3)};
        if constexpr (NBS == 2) {
          uint32_t bh[4], bl[4];
          LdMatrixX4S(bh, b_sb + 64 * j);
          LdMatrixX4S(bl, b_sb + 64 * j + 32);
#pragma unroll
          for (int nb = 0; nb < 2; ++nb) {
            int th[4], tl[4];
            MmaS8(th, af, bh[2 * nb], bh[2 * nb + 1]);
            MmaS8(tl, af, bl[2 * nb], bl[2 * nb + 1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) iacc[nb][e] += sc[e >> 1] * ((th[e] << 6) + tl[e]);
          }
        } else {
          uint32_t b[4];
          LdMatrixX4S(b, b_sb + 64 * j);
          int th[4], tl[4];
          MmaS8(th, af, b[0], b[1]);
          MmaS8(tl, af, b[2], b[3]);
#pragma unroll
          for (int e = 0; e < 4; ++e) iacc[0][e] += sc[e >> 1] * ((th[e] << 6) + tl[e]);
        }
      }
    }
    const uint32_t am[4] = {__float_as_uint(MinAsFloat(mw[0][0], t)), __float_as_uint(MinAsFloat(mw[1][0], t)),
                            __float_as_uint(MinAsFloat(mw[0][1], t)), __float_as_uint(MinAsFloat(mw[1][1], t))};
    const uint32_t min_addr = cur + MinOffset(K), scale_addr = cur + ScaleOffset(K);
#pragma unroll
    for (int nb = 0; nb < NBS; ++nb) {
      const uint4 bm = LdShared128(min_addr + ((c_sb * kNB + nb) * 32 + lane) * 16);
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      MmaTf32(c, am, bm.x, bm.y);
      MmaTf32(c, am, bm.z, bm.w);
      const float2 s = LdShared64F(scale_addr + (c_sb * kT + 8 * nb + 2 * t) * 4);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = fmaf(d64[e >> 1] * ((e & 1) != 0 ? s.y : s.x), static_cast<float>(iacc[nb][e]), acc[nb][e]);
        acc[nb][e] = fmaf(-dmin[e >> 1], c[e], v);
      }
    }
  };

  auto store_unit = [&] {
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
      if (nb < nbs) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int r = 8 * nb + 2 * t + c;
          if (r < rows) {
            float* dst = out + static_cast<int64_t>(first_slot + r) * out_cols;
            if constexpr (kGateUp) {
              dst[c_chunk * (kUnitRows / 2) + warp * 8 + g] = SiluTimes(acc[nb][c], acc[nb][2 + c]);
            } else {
              const int n = c_chunk * kUnitRows + warp * 16 + g;
              dst[n] = acc[nb][c];
              dst[n + 8] = acc[nb][2 + c];
            }
          }
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nb][e] = 0.0f;
    }
  };

#pragma unroll 1
  for (int f = 0; f < kStages - 1; ++f) issue(f);
#pragma unroll 1
  for (int f = 0; f < total; ++f) {
    CpAsyncWait<kStages - 2>();
    __syncwarp();  // every lane's copies of item f are visible; every lane is done with item f - 1
    if (f == 0 || (c_sb == 0 && c_chunk == 0)) switch_tile(f);  // the first item, or a new tile's
    issue(f + kStages - 1);  // double-buffered: also commits the next tile's copies
    if (nbs == 2) {
      super_block(std::integral_constant<int, 2>{}, f);
    } else {
      super_block(std::integral_constant<int, 1>{}, f);
    }
    if (++c_sb == KB) {
      store_unit();
      c_sb = 0;
      if (++c_chunk == units_per_tile) {
        c_chunk = 0;
        ++c_tile;
      }
    }
  }
  CpAsyncWait<0>();
}

template <bool kGateUp, int kWarps, int kStages, bool kDouble, int kFixedK>
cudaError_t LaunchKernel(const PrefillTile* tiles, int num_tiles, MmqActivations a, const int32_t* a_index, int K,
                         int N, int out_cols, float* out, cudaStream_t stream, const int* tile_count) {
  const int smem = (kDouble ? 2 : 1) * BufferBytes(K) + kWarps * kStages * kStageBytes;
  if (smem > kSmemLimit) return cudaErrorInvalidValue;
  constexpr auto kernel = MmqLean2Kernel<kGateUp, kWarps, kStages, kDouble, kFixedK>;
  const int64_t units = static_cast<int64_t>(num_tiles) * (N / (16 * kWarps));
  int64_t blocks = 0;
  if (cudaError_t e = mmq_device::PersistentBlocks<kernel>(kWarps * 32, smem, units, &blocks); e != cudaSuccess) {
    return e;
  }
  return LaunchPrefillPdl(kernel, static_cast<unsigned>(blocks), kWarps * 32, smem, stream, tiles, num_tiles, a, a_index,
                          K, N, out_cols, out, tile_count);
}

constexpr int kWarps = 16, kStages = 4;
constexpr int kRingBytes = kWarps * kStages * kStageBytes;  // 147456

// Two tile buffers when they fit beside the ring (K <= 1024).
__host__ __device__ constexpr bool DoubleFits(int K) { return 2 * BufferBytes(K) + kRingBytes <= kSmemLimit; }
static_assert(DoubleFits(512) && !DoubleFits(2048), "the 80B shapes: down double-buffered, gate/up not");

static_assert(BufferBytes(kMmqMaxK) + kRingBytes <= kSmemLimit, "one tile buffer fits beside the ring at any K");

// A/B switches for attributing a difference to kMmqLean2 (read once; the default is both off):
// TANDEM_MMQ_LEAN2_RUNTIME_K=1 runs the K-from-the-argument kernels at the 80B shapes too (as
// kMmqLean does), TANDEM_MMQ_LEAN2_SINGLE=1 single-buffers every tile (one buffer, two barriers a
// switch) where two would fit.
bool RuntimeK() {
  static const bool on = EnvSwitch("TANDEM_MMQ_LEAN2_RUNTIME_K");
  return on;
}
bool SingleBuffer() {
  static const bool on = EnvSwitch("TANDEM_MMQ_LEAN2_SINGLE");
  return on;
}

template <bool kGateUp>
cudaError_t LaunchGateUpOrDown(const PrefillTile* tiles, int num_tiles, MmqActivations a, const int32_t* a_index,
                               int K, int N, int out_cols, float* out, cudaStream_t stream, const int* tile_count) {
  if (N % (16 * kWarps) != 0) return cudaErrorInvalidValue;
  // The 80B shapes with K at compile time; any other K (<= kMmqMaxK) from the argument.
  if constexpr (kGateUp) {
    if (K == 2048 && !RuntimeK()) {
      return LaunchKernel<true, kWarps, kStages, DoubleFits(2048), 2048>(tiles, num_tiles, a, a_index, K, N, out_cols,
                                                                         out, stream, tile_count);
    }
  } else {
    if (K == 512 && !RuntimeK()) {
      return SingleBuffer() ? LaunchKernel<false, kWarps, kStages, false, 512>(tiles, num_tiles, a, a_index, K, N,
                                                                               out_cols, out, stream, tile_count)
                            : LaunchKernel<false, kWarps, kStages, true, 512>(tiles, num_tiles, a, a_index, K, N,
                                                                              out_cols, out, stream, tile_count);
    }
  }
  if (DoubleFits(K) && !SingleBuffer()) {
    return LaunchKernel<kGateUp, kWarps, kStages, true, 0>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream,
                                                           tile_count);
  }
  return LaunchKernel<kGateUp, kWarps, kStages, false, 0>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream,
                                                          tile_count);
}

}  // namespace
}  // namespace prefill_mmq_lean2

cudaError_t LaunchMmqLean2(bool gate_up, int tile_rows, const PrefillTile* tiles, int num_tiles, MmqActivations a,
                           const int32_t* a_index, int K, int N, int out_cols, float* out, cudaStream_t stream,
                           const int* tile_count) {
  using prefill_mmq_lean2::LaunchGateUpOrDown;
  if (tile_rows < 1 || tile_rows > 16) return cudaErrorInvalidValue;
  if (K <= 0 || K % 256 != 0 || K > kMmqMaxK || N <= 0) return cudaErrorInvalidValue;
  if (num_tiles <= 0) return cudaSuccess;
  return gate_up ? LaunchGateUpOrDown<true>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream, tile_count)
                 : LaunchGateUpOrDown<false>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream, tile_count);
}

}  // namespace tandem::cuda
