// PrefillKernel::kMmqLean: the integer-MMA Q4_K prefill kernel of expert_prefill_mmq.cu (same units,
// same per-warp cp.async rings, same arithmetic: expert_prefill_mmq.cuh) with fewer instructions per
// mma.m16n8k32. Tiles of at most 16 slots; 16 warps with rings of 4 (the shape kMmqWarps16 serves;
// kMmqLeanWarps8: 8 warps with rings of 8, no 128-register cap, for the A/B).
//
// Why: kMmqWarps16 is bound by its math (H200: 0.594 ms a layer at 512 tokens against 0.313 load-only,
// 0.653 math-only), and its SASS spends ~20.6 instructions per IMMA in the steady state of a
// super-block (PERF_NOTES.md, "kMmqLean"): the per-sub-block `nb < nbs` branches split every
// sub-block into its own basic block (no overlap of one sub-block's ldmatrix/MMA latency with the
// next), the swizzled B addresses are rebuilt from the thread index every sub-block (128 registers
// leave no room to keep them), an integer division (f % KB) and a 64-bit one (unit % units_per_tile)
// run every super-block, and the hi and lo products take two IMADs an element into two accumulators
// converted and combined separately. Here:
//  - the n8-block count (1 or 2) is dispatched once per super-block to a branch-free body;
//  - activation rows in shared memory are laid out per sub-block as [hi 32 B | lo 32 B] with a row
//    stride of 2K + 16 bytes (the 16-byte pad puts the 8 slot rows of one ldmatrix in 8 different bank
//    groups, which the XOR swizzle did), so every B address is one register per super-block plus an
//    immediate; with one n8 block a single ldmatrix.x4 fetches both the hi and the lo fragments;
//  - per element and sub-block one shift-add and one IMAD: iacc += sc_j · (64 · hi_j + lo_j), one
//    int32 accumulator (exact: |iacc| <= 8 · 63 · (64 · 32·15·128 + 32·15·128) < 2^31), converted to
//    f32 once per super-block with d / 64 (exact scaling by a power of two);
//  - the min term goes straight into the same f32 accumulator (one FMA, no second accumulator);
//  - super-block, unit and tile counters are incremented, never divided; the tile descriptor is read
//    once per unit by the producer and once per tile by the consumer.
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"
#include "gpu_service/backends/cuda/moe/mmq_device.cuh"

namespace tandem::cuda {
namespace prefill_mmq_lean {
namespace {

constexpr int kQ4KBlockBytes = 144;
constexpr int kStageBytes = 16 * kQ4KBlockBytes;  // one super-block of 16 rows: 2304 bytes
constexpr int kStageChunks = kStageBytes / 16;      // 144 copies of 16 bytes: 4 per lane + 1 for lanes < 16
constexpr int kNB = 2;                              // n8 blocks of a tile
constexpr int kT = 8 * kNB;                         // slots of a tile
constexpr int kSmemLimit = 227 * 1024;
static_assert(kStageChunks == 4 * 32 + 16, "the producer's lane layout assumes 144 chunks");

// Bytes of one slot's activation row in shared memory: per sub-block 32 bytes of hi then 32 of lo,
// plus 16 so that consecutive rows start in different 16-byte bank groups.
__host__ __device__ constexpr int RowStride(int K) { return 2 * K + 16; }

// Activations, scales [KB][kT], the min term's tf32 B operands [KB][kNB][32] float4, rows of `a`.
__host__ __device__ constexpr int ActSmemBytes(int K) {
  return kT * RowStride(K) + kT * (K / 256) * 4 + (K / 256) * kNB * 32 * 16 + kT * 8;
}

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

// Byte i of w, zero-extended (one PRMT).
__device__ __forceinline__ int ByteOf(uint32_t w, int i) { return static_cast<int>(__byte_perm(w, 0u, 0x4440u + i)); }

// Byte t of w (a 6-bit min) as an f32: 2^23 + m by one PRMT (0x4B0000mm), minus 2^23 (exact), instead
// of PRMT + I2F (the conversion pipe runs at a quarter of the ALU rate).
__device__ __forceinline__ float MinAsFloat(uint32_t w, int t) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u + static_cast<unsigned>(t))) - 8388608.0f;
}

__device__ __forceinline__ float SiluTimes(float g, float u) { return g * (1.0f / (1.0f + expf(-g))) * u; }

// As prefill_mmq::MmqQ4KKernel (kTf32Min, kFull): tiles of at most 16 slots, a: quantized rows of K,
// a_index maps a slot to its row of a (nullptr: the slot itself), N weight rows a tile (a multiple of
// 16·kWarps), out: act (gate/up, out_cols = inner) or partial (down, out_cols = h).
template <bool kGateUp, int kWarps, int kStages>
__global__ void __launch_bounds__(kWarps * 32, 1)
    MmqLeanKernel(const PrefillTile* __restrict__ tiles, int num_tiles, MmqActivations a,
                  const int32_t* __restrict__ a_index, int K, int N, int out_cols, float* __restrict__ out,
                  const int* __restrict__ tile_count) {
  // A device-planned call: the tiles were counted on the device; num_tiles is their bound.
  if (tile_count != nullptr) num_tiles = min(num_tiles, *tile_count);
  static_assert((kStages & (kStages - 1)) == 0, "ring stages: a power of two");
  constexpr int kThreads = kWarps * 32;
  constexpr int kUnitRows = 16 * kWarps;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int KB = static_cast<int>(static_cast<unsigned>(K) >> 8);  // K > 0: a shift, not a signed division
  const int RS = RowStride(K);
  const int64_t row_bytes = static_cast<int64_t>(KB) * kQ4KBlockBytes;
  const int units_per_tile = N / kUnitRows;
  const int64_t units = static_cast<int64_t>(num_tiles) * units_per_tile;
  const int64_t u_begin = units * blockIdx.x / gridDim.x, u_end = units * (blockIdx.x + 1) / gridDim.x;
  const int total = static_cast<int>(u_end - u_begin) * KB;  // items of every warp

  uint8_t* s_act = smem;
  float* s_scale = reinterpret_cast<float*>(smem + kT * RS);     // [KB][kT]
  float4* s_min = reinterpret_cast<float4*>(s_scale + KB * kT);  // [KB][kNB][32]
  int64_t* s_row = reinterpret_cast<int64_t*>(s_min + KB * kNB * 32);
  const uint32_t act_addr = SmemAddr(s_act);
  const uint32_t scale_addr = SmemAddr(s_scale), min_addr = SmemAddr(s_min);
  const uint32_t ring_addr = SmemAddr(smem + ActSmemBytes(K) + warp * kStages * kStageBytes);

  // ---- Producer (per lane): copy j of a stage is chunk q = lane + 32 j (j = 4 only for lanes < 16),
  // weight row q / 9 of the warp's 16, 16-byte piece q % 9 of that row's super-block.
  int p_tile = static_cast<int>(u_begin / units_per_tile);  // tile indices fit int (num_tiles does)
  int p_chunk = static_cast<int>(u_begin % units_per_tile);
  int p_sb = 0, p_stage = 0;
  const uint8_t* src[5];
  auto setup_unit = [&] {
    const PrefillTile tile = tiles[p_tile];
#pragma unroll
    for (int j = 0; j < 5; ++j) {
      const int q = j < 4 ? lane + 32 * j : 128 + (lane & 15);
      const int r = q / 9, piece = q % 9;
      if constexpr (kGateUp) {
        const int f = p_chunk * (kUnitRows / 2) + warp * 8 + (r & 7);
        src[j] = static_cast<const uint8_t*>(r < 8 ? tile.gate : tile.up) + f * row_bytes + piece * 16;
      } else {
        const int n = p_chunk * kUnitRows + warp * 16 + r;
        src[j] = static_cast<const uint8_t*>(tile.down) + n * row_bytes + piece * 16;
      }
    }
  };
  auto issue = [&](int f) {
    if (f < total) {
      if (p_sb == 0) setup_unit();
      const uint32_t dst = ring_addr + p_stage * kStageBytes + lane * 16;
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
      p_stage = (p_stage + 1) & (kStages - 1);
    }
    CpAsyncCommit();  // empty groups past the end keep the wait count uniform
  };

  // ---- Consumer: the unit (c_tile, c_chunk), super-block c_sb of it, in ring stage c_stage.
  int c_tile = static_cast<int>(u_begin / units_per_tile), loaded_tile = -1;
  int c_chunk = static_cast<int>(u_begin % units_per_tile);
  int c_sb = 0, c_stage = 0;
  int rows = 0, nbs = 0;
  int64_t first_slot = 0;
  float acc[kNB][4];
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nb][e] = 0.0f;
  }
  // A (weights, ldmatrix of a 32-byte qs chunk of 16 rows): row (lane & 7) + 8·((lane >> 3) & 1),
  // byte 16·(lane >> 4). B with two n8 blocks: slot (lane & 7) + 8·(lane >> 4), 16-byte half
  // (lane >> 3) & 1 of the sub-block's hi (lo: + 32). B with one: slot lane & 7, half (lane >> 3) & 1,
  // lanes 16-31 the lo plane, so the four registers are hi b0, b1 and lo b0, b1.
  const uint32_t a_off =
      static_cast<uint32_t>(((lane & 7) + 8 * ((lane >> 3) & 1)) * kQ4KBlockBytes + 16 + 16 * (lane >> 4));
  const uint32_t b2_base = act_addr + static_cast<uint32_t>(((lane & 7) + 8 * (lane >> 4)) * RS + 16 * ((lane >> 3) & 1));
  const uint32_t b1_base = act_addr + static_cast<uint32_t>((lane & 7) * RS + 16 * ((lane >> 3) & 1) + 32 * (lane >> 4));

  auto load_tile = [&](int tile_index) {
    const PrefillTile tile = tiles[tile_index];
    mmq_device::StageTileRows<kThreads>(tile, a_index, a, K, s_row, tid, [&](int r, int c, uint4 vh, uint4 vl) {
      uint8_t* dst = s_act + r * RS + (c >> 1) * 64 + (c & 1) * 16;  // per sub-block [hi 32 B | lo 32 B]
      *reinterpret_cast<uint4*>(dst) = vh;
      *reinterpret_cast<uint4*>(dst + 32) = vl;
    });
    for (int i = tid; i < tile.rows * KB; i += kThreads) {
      const int r = i / KB, b = i % KB;
      s_scale[b * kT + r] = a.scale[s_row[r] * KB + b];
    }
    // Entry (sb, nb, lane l): B fragment of the m16n8k8 MMA, b0 = sumx of sub-block 8·sb + l % 4 and
    // b1 of 8·sb + l % 4 + 4, for slot 8·nb + l / 4; then their residuals.
    const int subs = K / 32;
    for (int i = tid; i < KB * kNB * 32; i += kThreads) {
      const int l = i & 31, nb = (i >> 5) % kNB, sbi = (i >> 5) / kNB;
      const int r = 8 * nb + (l >> 2);
      if (r < tile.rows) {
        const float* sx = a.sumx + s_row[r] * subs + sbi * 8 + (l & 3);
        const float v0 = sx[0], v1 = sx[4];
        const float h0 = RoundTf32(v0), h1 = RoundTf32(v1);
        s_min[i] = make_float4(h0, h1, v0 - h0, v1 - h1);
      }
    }
    __syncthreads();
    rows = tile.rows;
    nbs = (rows + 7) >> 3;
    first_slot = tile.first_slot;
  };

  // One super-block of the warp's 16 rows against NBS n8 blocks of slots, without branches.
  auto super_block = [&](auto nbs_constant) {
    constexpr int NBS = decltype(nbs_constant)::value;
    const uint32_t st = ring_addr + c_stage * kStageBytes;
    // Heads of rows g and g + 8: d, dmin, and the packed 6-bit scales and mins (UnpackKScaleMin of
    // common/weights/block_layouts.h, four sub-blocks a word).
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
    const uint32_t b_sb = (NBS == 2 ? b2_base : b1_base) + c_sb * 512;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      uint32_t q[4];
      LdMatrixX4S(q, st + a_off + 32 * p);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * p + half;  // sub-block of the super-block
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
    // The min term Σ_j m_j · sumx_j as two tf32 MMAs (A: m_t, m_{t+4} of rows g and g + 8, exact; B:
    // the slots' sums of 32 as tf32 and residual), into the same f32 accumulators.
    const uint32_t am[4] = {__float_as_uint(MinAsFloat(mw[0][0], t)), __float_as_uint(MinAsFloat(mw[1][0], t)),
                            __float_as_uint(MinAsFloat(mw[0][1], t)), __float_as_uint(MinAsFloat(mw[1][1], t))};
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

  // Last super-block of a unit: element e of n8 block nb is (weight row g + 8·(e >> 1), slot
  // 8·nb + 2t + (e & 1)).
  auto store_unit = [&] {
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
      if (nb < nbs) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int r = 8 * nb + 2 * t + c;
          if (r < rows) {
            float* dst = out + (first_slot + r) * out_cols;
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
    issue(f + kStages - 1);
    if (c_sb == 0 && c_tile != loaded_tile) {
      load_tile(c_tile);
      loaded_tile = c_tile;
    }
    if (nbs == 2) {
      super_block(std::integral_constant<int, 2>{});
    } else {
      super_block(std::integral_constant<int, 1>{});
    }
    if (++c_sb == KB) {
      store_unit();
      c_sb = 0;
      if (++c_chunk == units_per_tile) {
        c_chunk = 0;
        ++c_tile;
      }
    }
    c_stage = (c_stage + 1) & (kStages - 1);
  }
  CpAsyncWait<0>();
}

template <bool kGateUp, int kWarps, int kStages>
cudaError_t LaunchKernel(const PrefillTile* tiles, int num_tiles, MmqActivations a, const int32_t* a_index, int K,
                         int N, int out_cols, float* out, cudaStream_t stream, const int* tile_count) {
  if (N % (16 * kWarps) != 0) return cudaErrorInvalidValue;
  const int smem = ActSmemBytes(K) + kWarps * kStages * kStageBytes;
  if (smem > kSmemLimit) return cudaErrorInvalidValue;
  constexpr auto kernel = MmqLeanKernel<kGateUp, kWarps, kStages>;
  const int64_t units = static_cast<int64_t>(num_tiles) * (N / (16 * kWarps));
  int64_t blocks = 0;
  if (cudaError_t e = mmq_device::PersistentBlocks<kernel>(kWarps * 32, smem, units, &blocks); e != cudaSuccess) {
    return e;
  }
  kernel<<<static_cast<unsigned>(blocks), kWarps * 32, smem, stream>>>(tiles, num_tiles, a, a_index, K, N, out_cols,
                                                                         out, tile_count);
  return cudaGetLastError();
}

}  // namespace
}  // namespace prefill_mmq_lean

cudaError_t LaunchMmqLean(bool gate_up, int warps, int tile_rows, const PrefillTile* tiles, int num_tiles,
                          MmqActivations a, const int32_t* a_index, int K, int N, int out_cols, float* out,
                          cudaStream_t stream, const int* tile_count) {
  using prefill_mmq_lean::LaunchKernel;
  if (tile_rows < 1 || tile_rows > 16 || (warps != 8 && warps != 16)) return cudaErrorInvalidValue;
  if (K <= 0 || K % 256 != 0 || K > kMmqMaxK || N <= 0) return cudaErrorInvalidValue;
  if (num_tiles <= 0) return cudaSuccess;
  if (warps == 8) {
    return gate_up ? LaunchKernel<true, 8, 8>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream, tile_count)
                   : LaunchKernel<false, 8, 8>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream, tile_count);
  }
  return gate_up ? LaunchKernel<true, 16, 4>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream, tile_count)
                 : LaunchKernel<false, 16, 4>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream, tile_count);
}

}  // namespace tandem::cuda
