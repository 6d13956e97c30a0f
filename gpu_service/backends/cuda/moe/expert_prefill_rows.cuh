// Device code of the row-streamed Q4_K prefill GEMM (PrefillKernel::kStreamedRows; expert_prefill.cu
// includes this header and launches it; no host code but the geometry).
//
// Why a third kernel: the streamed kernel (expert_prefill_stream.cuh) reads, per 128-deep stage,
// an 80-byte piece of each of 128 weight rows 1152 bytes apart: short scattered DRAM reads, about
// 1.1-1.2 TB/s at 512 tokens. Here a stage is a few whole weight rows over ALL of K, so the bytes
// a stage copies are one or two contiguous runs (gate/up at K = 2048: 8 gate rows = 9 KB and the 8
// matching up rows = 9 KB; down at K = 512: 64 rows = 18 KB), and each weight byte is read once
// per tile. The price: the tile's activations over all of K must be at hand, and the block's warps
// split K (one Q4_K super-block each) with a shared-memory reduction per stage.
//  - The activations live in registers: warp (group, part) only ever needs super-block `part`
//    of the tile's rows (16 or 32 rows x 256 f16: 64 or 128 registers, as ready-made A fragments),
//    loaded from global (L2) when the block's walk enters a new tile. Tiles hold at most 16
//    (kFrags 1) or 32 (kFrags 2) rows, hence K <= 2048 (at most 8 super-blocks, one per warp).
//  - The k order inside each 16-deep MMA is permuted (the same way in A and B, so the products are
//    unchanged): a thread's B pair is quant bytes (0, 2) or (1, 3) of its 4-byte word, so a weight
//    pair is one LOP3 on the word (no byte permute); its A pair is permuted once per tile instead.
//  - Raw Q4_K goes global -> shared through a cp.async ring of `stages` stages (runtime; 4 to 11
//    stages of ~18 KB: 55-190 KB of weights per SM in flight).
//  - The block is persistent and walks a contiguous range of (tile, stage) units, each one stage.
//
// Geometry (RowsGeometry): sbs = K / 256 super-blocks per row; G = max(1, 8 / sbs) row groups of 16
// B rows per stage (R = 16 G rows), P = 8 / G warps per group, warp part p < sbs handles
// super-block p (warps with p >= sbs idle in the MMAs). gate/up stage: smem rows 0 .. R/2 - 1 are
// gate rows f0 .., R/2 .. R - 1 the up rows of the same features, so a warp's n8 block 0 is gate and
// n8 block 1 up; down stage: R consecutive rows of down. Shared rows are padded so that rows start
// 32 bytes apart modulo 128 (the 8-byte fragment loads of four rows hit 32 distinct banks).
//
// Values: weight = f16(d·sc)·q + f16(−dmin·m) in one f16 FMA (StageFactors / the nibble-to-f16
// trick of expert_prefill_stream.cuh): the f16 weights are identical to both other kernels'.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_ROWS_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_ROWS_CUH_

#include <cuda_fp16.h>

#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_stream.cuh"

namespace tandem::cuda::prefill_rows {

using prefill_stream::DequantNibblePair;  // bytes 0 and 2 of a word; shifted by 8 for bytes 1 and 3

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kQ4KBlockBytes = 144;
constexpr int kMaxSuperBlocks = kWarps;  // K <= 2048
constexpr int kMaxStages = 11;

struct RowsGeometry {
  int sbs;          // super-blocks per B row (K / 256)
  int groups;       // G: 16-row groups per stage
  int parts;        // P = 8 / G: warps per group (each one super-block)
  int rows;         // R = 16 G: B rows per stage
  int row_bytes;    // 144 sbs
  int row_stride;   // shared bytes per row (row_bytes padded to 32 mod 128)
  int stage_bytes;  // R · row_stride
};

__host__ __device__ inline RowsGeometry MakeRowsGeometry(int K) {
  RowsGeometry g{};
  g.sbs = K / 256;
  g.groups = g.sbs >= kWarps ? 1 : kWarps / g.sbs;
  g.parts = kWarps / g.groups;
  g.rows = 16 * g.groups;
  g.row_bytes = g.sbs * kQ4KBlockBytes;
  g.row_stride = g.row_bytes + ((32 - g.row_bytes % 128) + 128) % 128;
  g.stage_bytes = g.rows * g.row_stride;
  return g;
}

// Shared bytes of the reduction buffer: P parts × (16 kFrags slots) × R rows of f32 = 8 KB per fragment.
__host__ __device__ constexpr int RedBytes(int frags) { return kWarps * 16 * 16 * frags * 4; }

__device__ __forceinline__ void CpAsyncWaitDyn(int pending) {
  switch (pending) {
    case 0: CpAsyncWait<0>(); break;
    case 1: CpAsyncWait<1>(); break;
    case 2: CpAsyncWait<2>(); break;
    case 3: CpAsyncWait<3>(); break;
    case 4: CpAsyncWait<4>(); break;
    case 5: CpAsyncWait<5>(); break;
    case 6: CpAsyncWait<6>(); break;
    case 7: CpAsyncWait<7>(); break;
    case 8: CpAsyncWait<8>(); break;
    default: CpAsyncWait<9>(); break;
  }
}

// tiles: rows <= 16 kFrags each. a: f16 rows of K elements (a_index: row of each slot, or nullptr:
// the slot itself). B rows: gate/up N = 2·inner (features interleaved as in the other kernels'
// contract; here staged gate block then up block), down N = h. K a multiple of 256, <= 2048; N a
// multiple of R. `stages` in [2, kMaxStages] ring stages (shared: stages · stage_bytes + RedBytes).
template <bool kGateUp, int kFrags>
__global__ void __launch_bounds__(kThreads, kFrags == 1 ? 2 : 1)
    RowsQ4KGemmKernel(const PrefillTile* __restrict__ tiles, int num_tiles, const uint16_t* __restrict__ a,
                      const int32_t* __restrict__ a_index, int K, int N, int out_cols, int stages,
                      uint16_t* __restrict__ act_out, float* __restrict__ f32_out) {
  constexpr int kSlots = 16 * kFrags;
  extern __shared__ __align__(128) uint8_t smem[];
  const RowsGeometry geo = MakeRowsGeometry(K);
  const int R = geo.rows, half_rows = R / 2;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int spt = N / R;  // stages per tile
  const int64_t units = static_cast<int64_t>(num_tiles) * spt;
  const int64_t u_begin = units * blockIdx.x / gridDim.x, u_end = units * (blockIdx.x + 1) / gridDim.x;
  const int total = static_cast<int>(u_end - u_begin);
  const uint32_t ring = SmemAddr(smem);
  float* red = reinterpret_cast<float*>(smem + stages * geo.stage_bytes);
  const int row_chunks = geo.row_bytes / 16;

  // ---- Producer: unit u_begin + f into ring slot f % stages.
  auto issue = [&](int f) {
    if (f < total) {
      const int64_t u = u_begin + f;
      const PrefillTile* tp = tiles + u / spt;
      const int st = static_cast<int>(u % spt);
      const uint8_t *src0, *src1;  // rows 0 .. R/2 - 1 and R/2 .. R - 1 of the stage
      if constexpr (kGateUp) {
        const int64_t f0 = static_cast<int64_t>(st) * half_rows;
        src0 = static_cast<const uint8_t*>(tp->gate) + f0 * geo.row_bytes;
        src1 = static_cast<const uint8_t*>(tp->up) + f0 * geo.row_bytes;
      } else {
        src0 = static_cast<const uint8_t*>(tp->down) + static_cast<int64_t>(st) * R * geo.row_bytes;
        src1 = src0 + static_cast<int64_t>(half_rows) * geo.row_bytes;
      }
      const uint32_t dst = ring + (f % stages) * geo.stage_bytes;
      // Warp w copies rows w, w + 8, ...: each a contiguous run of row_bytes, 16 bytes a lane.
      for (int r = warp; r < R; r += kWarps) {
        const uint8_t* src = r < half_rows ? src0 + r * geo.row_bytes : src1 + (r - half_rows) * geo.row_bytes;
        for (int c = lane; c < row_chunks; c += 32) CpAsync16(dst + r * geo.row_stride + 16 * c, src + 16 * c);
      }
    }
    CpAsyncCommit();  // empty groups past the end keep the wait count uniform
  };

  // ---- Consumer: warp (gw, p), thread (g, t) of the MMA layout.
  const int gw = warp / geo.parts, p = warp % geo.parts;
  const bool active = p < geo.sbs;
  const int g = lane >> 2, t = lane & 3;
  // afr[mf][sub-block][pair][4]: A fragments of the 16-deep MMAs of k = 8t .. 8t + 3 (pair 0) and
  // 8t + 4 .. 8t + 7 (pair 1) of each 32-deep sub-block of super-block p, permuted to (k0, k2), (k1, k3).
  uint32_t afr[kFrags][8][2][4];
  int64_t cur_tile = -1;
  auto load_a = [&](const PrefillTile& tile) {
#pragma unroll
    for (int mf = 0; mf < kFrags; ++mf) {
      const uint4* src[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mf * 16 + g + 8 * h;
        src[h] = nullptr;
        if (r < tile.rows) {
          const int slot = tile.first_slot + r;
          const int64_t row = a_index != nullptr ? a_index[slot] : slot;
          src[h] = reinterpret_cast<const uint4*>(a + row * K + 256 * p + 8 * t);
        }
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint4 w = src[0] != nullptr ? __ldg(src[0] + 4 * j) : make_uint4(0, 0, 0, 0);
        const uint4 v = src[1] != nullptr ? __ldg(src[1] + 4 * j) : make_uint4(0, 0, 0, 0);
        afr[mf][j][0][0] = __byte_perm(w.x, w.y, 0x5410);
        afr[mf][j][0][1] = __byte_perm(v.x, v.y, 0x5410);
        afr[mf][j][0][2] = __byte_perm(w.x, w.y, 0x7632);
        afr[mf][j][0][3] = __byte_perm(v.x, v.y, 0x7632);
        afr[mf][j][1][0] = __byte_perm(w.z, w.w, 0x5410);
        afr[mf][j][1][1] = __byte_perm(v.z, v.w, 0x5410);
        afr[mf][j][1][2] = __byte_perm(w.z, w.w, 0x7632);
        afr[mf][j][1][3] = __byte_perm(v.z, v.w, 0x7632);
      }
    }
  };
  // Shared row of this thread's B row within n8 block nb.
  auto brow = [&](int nb) {
    if constexpr (kGateUp) return (nb == 0 ? 0 : half_rows) + 8 * gw + g;
    return 16 * gw + 8 * nb + g;
  };

  auto compute = [&](int f) {
    const uint8_t* stage = smem + (f % stages) * geo.stage_bytes;
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      const int row = brow(nb);
      const uint8_t* raw = stage + row * geo.row_stride + p * kQ4KBlockBytes;
      const uint4 head = *reinterpret_cast<const uint4*>(raw);
      uint32_t fo[2][4];  // sub-block i: fo[i / 4][i % 4]
      prefill_stream::StageFactors(head, 0, fo[0]);
      prefill_stream::StageFactors(head, 1, fo[1]);
      float acc[kFrags][4];
#pragma unroll
      for (int mf = 0; mf < kFrags; ++mf) {
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mf][q] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // Quant bytes 32j + 8t .. + 7: low nibbles sub-block 2j (k 8t .. 8t + 7), high 2j + 1.
        const uint2 q = *reinterpret_cast<const uint2*>(raw + 16 + 32 * j + 8 * t);
        const uint32_t x1 = q.x >> 8, y1 = q.y >> 8;
        const uint32_t flo = fo[j >> 1][2 * (j & 1)], fhi = fo[j >> 1][2 * (j & 1) + 1];
        const uint32_t lo_a0 = DequantNibblePair<false>(q.x, flo), lo_a1 = DequantNibblePair<false>(x1, flo);
        const uint32_t lo_b0 = DequantNibblePair<false>(q.y, flo), lo_b1 = DequantNibblePair<false>(y1, flo);
        const uint32_t hi_a0 = DequantNibblePair<true>(q.x, fhi), hi_a1 = DequantNibblePair<true>(x1, fhi);
        const uint32_t hi_b0 = DequantNibblePair<true>(q.y, fhi), hi_b1 = DequantNibblePair<true>(y1, fhi);
#pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
          MmaF16(acc[mf], afr[mf][2 * j][0], lo_a0, lo_a1);
          MmaF16(acc[mf], afr[mf][2 * j][1], lo_b0, lo_b1);
          MmaF16(acc[mf], afr[mf][2 * j + 1][0], hi_a0, hi_a1);
          MmaF16(acc[mf], afr[mf][2 * j + 1][1], hi_b0, hi_b1);
        }
      }
      // c0, c1 at (slot g, B rows 2t, 2t + 1 of the n8 block), c2, c3 at slot g + 8.
      const int out_row = row - g + 2 * t;
#pragma unroll
      for (int mf = 0; mf < kFrags; ++mf) {
        const int s = mf * 16 + g;
        *reinterpret_cast<float2*>(red + (p * kSlots + s) * R + out_row) = make_float2(acc[mf][0], acc[mf][1]);
        *reinterpret_cast<float2*>(red + (p * kSlots + s + 8) * R + out_row) = make_float2(acc[mf][2], acc[mf][3]);
      }
    }
  };

  const int used_parts = geo.sbs < geo.parts ? geo.sbs : geo.parts;
  auto reduce = [&](int f) {
    const int64_t u = u_begin + f;
    const PrefillTile tile = tiles[u / spt];
    const int st = static_cast<int>(u % spt);
    const int items = kSlots * half_rows;
    for (int item = tid; item < items; item += kThreads) {
      const int s = item / half_rows, j = item - s * half_rows;
      if (s >= tile.rows) continue;
      const int64_t slot = tile.first_slot + s;
      float v0 = 0.0f, v1 = 0.0f;
      for (int q = 0; q < used_parts; ++q) {
        const float* r = red + (q * kSlots + s) * R;
        if constexpr (kGateUp) {
          v0 += r[j];
          v1 += r[half_rows + j];
        } else {
          v0 += r[2 * j];
          v1 += r[2 * j + 1];
        }
      }
      if constexpr (kGateUp) {
        act_out[slot * out_cols + st * half_rows + j] = __half_as_ushort(__float2half_rn(prefill_stream::SiluTimes(v0, v1)));
      } else {
        *reinterpret_cast<float2*>(f32_out + slot * out_cols + st * R + 2 * j) = make_float2(v0, v1);
      }
    }
  };

#pragma unroll 1
  for (int f = 0; f < stages - 1; ++f) issue(f);
#pragma unroll 1
  for (int f = 0; f < total; ++f) {
    CpAsyncWaitDyn(stages - 2);
    // Stage f has landed for every thread's copies; every thread has left reduce(f − 1), so the
    // reduction buffer and ring slot (f − 1) % stages are free.
    __syncthreads();
    issue(f + stages - 1);
    if (active) {
      const int64_t tile_index = (u_begin + f) / spt;
      if (tile_index != cur_tile) {
        load_a(tiles[tile_index]);
        cur_tile = tile_index;
      }
      compute(f);
    }
    __syncthreads();
    reduce(f);
  }
  CpAsyncWait<0>();
}

}  // namespace tandem::cuda::prefill_rows

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_ROWS_CUH_
