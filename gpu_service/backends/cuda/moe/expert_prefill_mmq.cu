// The integer-MMA Q4_K prefill kernels (declarations and the arithmetic: expert_prefill_mmq.cuh).
//
// Shape of the work: a unit is (row tile of at most T = 8·kNB slots of one expert, 16·kWarps weight
// rows); a block is persistent and walks a contiguous range of units. Warp w owns 16 weight rows of
// each unit (gate/up: rows 0-7 gate features f0 .. f0 + 7, rows 8-15 the up rows of the same
// features, so each thread's accumulators hold gate and up of one feature for SiLU·up; down: 16
// consecutive output features) and streams them through its OWN cp.async ring: a stage is one
// super-block (144 bytes) of each of the 16 rows, 144 copies of 16 bytes from the warp's lanes;
// each warp waits only on its own copies (wait_group + __syncwarp), so no block barrier sits between
// the loads and the MMAs, and kStages - 1 stages of every warp stay in flight across unit
// boundaries (8 warps × 7 × 2.3 KB = 129 KB a block at 16 slots).
//
// The tile's quantized activations (hi and lo planes over all of K, the scales and the sums of 32)
// stay in shared memory while the block works on that tile; the block reloads them (plain loads,
// two __syncthreads) only when its walk enters a new tile. Rows are swizzled by 16-byte chunk
// (chunk ^ (slot & 7)) so that the eight slot rows of one ldmatrix hit eight bank groups.
//
// Per super-block and warp: 4 ldmatrix of the quants (A of 8 sub-blocks), per sub-block and pair of
// n8 slot blocks 2 ldmatrix (hi, lo B fragments) and per n8 block 2 MMAs (hi, lo), the integer
// sub-block scales applied with IMADs into two int32 sums, the min term as f32 FMAs with the sums
// of 32; n8 blocks past the tile's rows are skipped.
//
// Measured (H200, 2026-12-01, expert_prefill_bench, 512 tokens, PERF_NOTES.md): the math, not the
// loads, bounds it: load-only 0.31 ms a layer (2.9 TB/s), math-only 0.65, both 0.77 with 8 warps;
// 16 warps (rings of 4) 0.59, 4 warps (rings of 16) 1.23: the warps' instruction latency is what
// more warps hide. Hence kMmqWarps16 for small groups, now the A/B baseline of kMmqLean
// (expert_prefill_mmq_lean.cu: the same kernel with fewer instructions per MMA, the default).
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"

#include <cuda_fp16.h>

#include <algorithm>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/moe/mmq_device.cuh"
#include "gpu_service/backends/cuda/moe/mmq_quantize.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace prefill_mmq {
namespace {

constexpr int kQ4KBlockBytes = 144;
constexpr int kStageBytes = 16 * kQ4KBlockBytes;  // one super-block of 16 rows: 2304 bytes
constexpr int kStageChunks = kStageBytes / 16;      // 144 copies of 16 bytes
constexpr int kChunksPerLane = (kStageChunks + 31) / 32;
constexpr int kSmemLimit = 227 * 1024;

// kFullL2Prefetch: kFull, and each warp has L2 prefetch (cp.async.bulk.prefetch.L2) its rows of the
// unit after the one its ring enters, as contiguous runs (gate/up: 8 gate rows and 8 up rows, 9 KB
// each at h = 2048; down: 16 rows), so that DRAM sees whole rows rather than 144-byte pieces.
enum Mode { kFull, kLoadOnly, kMathOnly, kHiOnly, kFullL2Prefetch };

// The min term's operand: kTf32Min, per (super-block, n8 block, lane) the lane's two tf32 B
// values and their f32 residuals (one 16-byte load); else the sums of 32 per (sub-block, slot).
__host__ __device__ constexpr int SumSmemBytes(int tokens, int K, bool tf32_min) {
  return tf32_min ? (K / 256) * (tokens / 8) * 32 * 16 : tokens * (K / 32) * 4;
}

// hi, lo, scales, the min term's operand, and the tile's row of `a` per slot (int64).
__host__ __device__ constexpr int ActSmemBytes(int tokens, int K, bool tf32_min) {
  return 2 * tokens * K + tokens * (K / 256) * 4 + SumSmemBytes(tokens, K, tf32_min) + tokens * 8;
}


using mmq_device::LdMatrixX4S;
using mmq_device::MmaS8;
using mmq_device::MmaTf32;
using mmq_device::RoundTf32;

__device__ __forceinline__ int Byte(uint32_t w, int i) { return static_cast<int>((w >> (8 * i)) & 0xFFu); }

__device__ __forceinline__ float SiluTimes(float g, float u) { return g * (1.0f / (1.0f + expf(-g))) * u; }

// tiles: rows <= 8·kNB each. a: quantized rows of K; a_index maps a slot to its row of a (nullptr:
// the slot itself). N weight rows per tile (gate/up: 2·inner as gate/up pairs of 8; down: h), a
// multiple of 16·kWarps. out: act (gate/up, out_cols = inner) or partial (down, out_cols = h).
//
// kTf32Min: the min term Σ_j m_j · sumx_j of each super-block as two tf32 MMAs (A: the 16 rows' m_j,
// exact small integers; B: the slots' sums of 32 split into a tf32 part and its residual, so the
// product is f32-accurate), then one FMA by dmin per accumulator; otherwise an FMA per sub-block.
template <bool kGateUp, int kNB, int kWarps, int kStages, int kMode, bool kTf32Min>
__global__ void __launch_bounds__(kWarps * 32, 1)
    MmqQ4KKernel(const PrefillTile* __restrict__ tiles, int num_tiles, MmqActivations a,
                 const int32_t* __restrict__ a_index, int K, int N, int out_cols, float* __restrict__ out) {
  constexpr int kT = 8 * kNB;
  constexpr int kThreads = kWarps * 32;
  constexpr int kUnitRows = 16 * kWarps;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int KB = K / 256;
  const int64_t row_bytes = static_cast<int64_t>(KB) * kQ4KBlockBytes;
  const int units_per_tile = N / kUnitRows;
  const int64_t units = static_cast<int64_t>(num_tiles) * units_per_tile;
  const int64_t u_begin = units * blockIdx.x / gridDim.x, u_end = units * (blockIdx.x + 1) / gridDim.x;
  const int total = static_cast<int>(u_end - u_begin) * KB;  // items of every warp

  int8_t* s_hi = reinterpret_cast<int8_t*>(smem);
  int8_t* s_lo = s_hi + kT * K;
  float* s_scale = reinterpret_cast<float*>(s_lo + kT * K);  // [KB][kT]
  float* s_sumx = s_scale + KB * kT;                          // [K / 32][kT], or kTf32Min's float4s
  int64_t* s_row = reinterpret_cast<int64_t*>(reinterpret_cast<uint8_t*>(s_sumx) + SumSmemBytes(kT, K, kTf32Min));
  uint8_t* ring = smem + ActSmemBytes(kT, K, kTf32Min) + warp * kStages * kStageBytes;
  const uint32_t ring_addr = SmemAddr(ring);
  const uint32_t hi_addr = SmemAddr(s_hi), lo_addr = SmemAddr(s_lo);

  // ---- Producer (per lane): item f of this warp is super-block p_sb of unit p_unit.
  int64_t p_unit = u_begin;
  int p_sb = 0;
  const uint8_t* src[kChunksPerLane];
  auto setup_unit = [&] {
    const PrefillTile tile = tiles[p_unit / units_per_tile];
    const int chunk = static_cast<int>(p_unit % units_per_tile);
#pragma unroll
    for (int j = 0; j < kChunksPerLane; ++j) {
      const int q = lane + 32 * j;
      const int r = q / 9, piece = q % 9;
      src[j] = nullptr;
      if (q < kStageChunks) {
        if constexpr (kGateUp) {
          const int f = chunk * (kUnitRows / 2) + warp * 8 + (r & 7);
          src[j] = static_cast<const uint8_t*>(r < 8 ? tile.gate : tile.up) + f * row_bytes + piece * 16;
        } else {
          const int n = chunk * kUnitRows + warp * 16 + r;
          src[j] = static_cast<const uint8_t*>(tile.down) + n * row_bytes + piece * 16;
        }
      }
    }
    if constexpr (kMode == kFullL2Prefetch) {
      const int64_t next = p_unit + 1;
      if (next < u_end && lane < (kGateUp ? 2 : 1)) {
        const PrefillTile nt = tiles[next / units_per_tile];
        const int nc = static_cast<int>(next % units_per_tile);
        if constexpr (kGateUp) {
          const int f = nc * (kUnitRows / 2) + warp * 8;
          PrefetchL2(static_cast<const uint8_t*>(lane == 0 ? nt.gate : nt.up) + f * row_bytes,
                     static_cast<unsigned>(8 * row_bytes));
        } else {
          PrefetchL2(static_cast<const uint8_t*>(nt.down) + (nc * kUnitRows + warp * 16) * row_bytes,
                     static_cast<unsigned>(16 * row_bytes));
        }
      }
    }
  };
  auto issue = [&](int f) {
    if (f < total) {
      if (p_sb == 0) setup_unit();
      if constexpr (kMode != kMathOnly) {
        const uint32_t dst = ring_addr + (f % kStages) * kStageBytes;
#pragma unroll
        for (int j = 0; j < kChunksPerLane; ++j) {
          if (src[j] != nullptr) CpAsync16(dst + (lane + 32 * j) * 16, src[j] + p_sb * kQ4KBlockBytes);
        }
      }
      if (++p_sb == KB) {
        p_sb = 0;
        ++p_unit;
      }
    }
    CpAsyncCommit();  // empty groups past the end keep the wait count uniform
  };

  // ---- Consumer.
  float acc[kNB][4], accm[kNB][4];
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nb][e] = accm[nb][e] = 0.0f;
  }
  // ldmatrix lanes: A rows (lane & 7) + 8·((lane >> 3) & 1), byte 16·(lane >> 4) of a 32-byte chunk;
  // B slot rows (lane & 7) + 8·(lane >> 4), 16-byte chunk + ((lane >> 3) & 1).
  const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1);
  const int a_col = 16 * (lane >> 4);
  const int b_tok = (lane & 7) + 8 * (lane >> 4);
  // This lane's B byte offsets within a super-block of its slot row, per sub-block j: the 16-byte
  // chunk 2j + ((lane >> 3) & 1), swizzled by the slot row (b_tok & 7, the same for tok + 16).
  uint32_t b_off[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) b_off[j] = static_cast<uint32_t>(((2 * j + ((lane >> 3) & 1)) ^ (b_tok & 7)) << 4);
  int rows = 0, nbs = 0;
  int64_t first_slot = 0;
  int64_t c_unit = u_begin - 1;
  int64_t loaded_tile = -1;

  // The tile's quantized rows into shared memory. The slots' rows of `a` go to s_row first, so that
  // the copies below issue 8 independent loads a thread per round (no load waits on an index load).
  auto load_tile = [&](int64_t tile_index) {
    const PrefillTile tile = tiles[tile_index];
    mmq_device::StageTileRows<kThreads>(tile, a_index, a, K, s_row, tid, [&](int r, int c, uint4 vh, uint4 vl) {
      const int dst = r * K + ((c ^ (r & 7)) << 4);  // 16-byte chunks XOR-swizzled by row
      *reinterpret_cast<uint4*>(s_hi + dst) = vh;
      *reinterpret_cast<uint4*>(s_lo + dst) = vl;
    });
    const int subs = K / 32;
    for (int i = tid; i < tile.rows * KB; i += kThreads) {
      const int r = i / KB, b = i % KB;
      s_scale[b * kT + r] = a.scale[s_row[r] * KB + b];
    }
    if constexpr (!kTf32Min) {
      for (int i = tid; i < tile.rows * subs; i += kThreads) {
        const int r = i / subs, j = i % subs;
        s_sumx[j * kT + r] = a.sumx[s_row[r] * subs + j];
      }
    } else {
      // Entry (sb, nb, lane l): B fragment of the m16n8k8 MMA, b0 = sumx of sub-block 8·sb + l % 4 and
      // b1 of 8·sb + l % 4 + 4, for slot 8·nb + l / 4; then their residuals.
      for (int i = tid; i < KB * kNB * 32; i += kThreads) {
        const int l = i & 31, nb = (i >> 5) % kNB, sbi = (i >> 5) / kNB;
        const int r = 8 * nb + (l >> 2);
        if (r < tile.rows) {
          const float* src = a.sumx + s_row[r] * subs + sbi * 8 + (l & 3);
          const float v0 = src[0], v1 = src[4];
          const float h0 = RoundTf32(v0), h1 = RoundTf32(v1);
          reinterpret_cast<float4*>(s_sumx)[i] = make_float4(h0, h1, v0 - h0, v1 - h1);
        }
      }
    }
    __syncthreads();
  };

  auto compute = [&](int f) {
    const int sb = f % KB;
    if (sb == 0) {
      ++c_unit;
      const int64_t tile_index = c_unit / units_per_tile;
      if (tile_index != loaded_tile) {
        if constexpr (kMode != kLoadOnly) load_tile(tile_index);
        loaded_tile = tile_index;
      }
      const PrefillTile tile = tiles[tile_index];
      rows = tile.rows;
      nbs = (rows + 7) >> 3;
      first_slot = tile.first_slot;
    }
    const int chunk = static_cast<int>(c_unit % units_per_tile);
    if constexpr (kMode != kLoadOnly) {
      const uint8_t* st = ring + (f % kStages) * kStageBytes;
      const uint32_t st_addr = ring_addr + (f % kStages) * kStageBytes;
      // Heads of rows g and g + 8: d, dmin, and the packed 6-bit scales and mins (UnpackKScaleMin of
      // common/weights/block_layouts.h, four sub-blocks a word).
      float d[2], dmin[2];
      uint32_t scw[2][2], mw[2][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 head = *reinterpret_cast<const uint4*>(st + (g + 8 * h) * kQ4KBlockBytes);
        const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&head.x));
        d[h] = dd.x;
        dmin[h] = dd.y;
        scw[h][0] = head.y & 0x3F3F3F3Fu;
        mw[h][0] = head.z & 0x3F3F3F3Fu;
        scw[h][1] = (head.w & 0x0F0F0F0Fu) | ((head.y >> 2) & 0x30303030u);
        mw[h][1] = ((head.w >> 4) & 0x0F0F0F0Fu) | ((head.z >> 2) & 0x30303030u);
      }
      int ihi[kNB][4], ilo[kNB][4];
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) ihi[nb][e] = ilo[nb][e] = 0;
      }
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        uint32_t q[4];
        LdMatrixX4S(q, st_addr + a_row * kQ4KBlockBytes + 16 + 32 * p + a_col);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int j = 2 * p + half;  // sub-block of the super-block
          uint32_t af[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) af[i] = (half == 0 ? q[i] : q[i] >> 4) & 0x0F0F0F0Fu;
          const int sc0 = Byte(scw[0][j >> 2], j & 3), sc1 = Byte(scw[1][j >> 2], j & 3);
          float dm0 = 0.0f, dm1 = 0.0f;
          if constexpr (!kTf32Min) {
            dm0 = dmin[0] * static_cast<float>(Byte(mw[0][j >> 2], j & 3));
            dm1 = dmin[1] * static_cast<float>(Byte(mw[1][j >> 2], j & 3));
          }
#pragma unroll
          for (int pr = 0; pr < kNB / 2; ++pr) {
            if (2 * pr < nbs) {
              const uint32_t off = static_cast<uint32_t>((16 * pr + b_tok) * K + sb * 256) + b_off[j];
              uint32_t bh[4], bl[4] = {0, 0, 0, 0};
              LdMatrixX4S(bh, hi_addr + off);
              if constexpr (kMode != kHiOnly) LdMatrixX4S(bl, lo_addr + off);
#pragma unroll
              for (int qq = 0; qq < 2; ++qq) {
                const int nb = 2 * pr + qq;
                if (nb < nbs) {
                  int th[4], tl[4] = {0, 0, 0, 0};
                  MmaS8(th, af, bh[2 * qq], bh[2 * qq + 1]);
                  if constexpr (kMode != kHiOnly) MmaS8(tl, af, bl[2 * qq], bl[2 * qq + 1]);
                  ihi[nb][0] += sc0 * th[0];
                  ihi[nb][1] += sc0 * th[1];
                  ihi[nb][2] += sc1 * th[2];
                  ihi[nb][3] += sc1 * th[3];
                  ilo[nb][0] += sc0 * tl[0];
                  ilo[nb][1] += sc0 * tl[1];
                  ilo[nb][2] += sc1 * tl[2];
                  ilo[nb][3] += sc1 * tl[3];
                  if constexpr (!kTf32Min) {
                    const float2 sx = *reinterpret_cast<const float2*>(s_sumx + (sb * 8 + j) * kT + 8 * nb + 2 * t);
                    accm[nb][0] = fmaf(dm0, sx.x, accm[nb][0]);
                    accm[nb][1] = fmaf(dm0, sx.y, accm[nb][1]);
                    accm[nb][2] = fmaf(dm1, sx.x, accm[nb][2]);
                    accm[nb][3] = fmaf(dm1, sx.y, accm[nb][3]);
                  }
                }
              }
            }
          }
        }
      }
      if constexpr (kTf32Min) {
        // A of the min-term MMA: a0 m_t (row g), a1 m_t (row g + 8), a2 m_{t+4} (row g), a3 m_{t+4} (row g + 8).
        const uint32_t am[4] = {__float_as_uint(static_cast<float>(Byte(mw[0][0], t))),
                                __float_as_uint(static_cast<float>(Byte(mw[1][0], t))),
                                __float_as_uint(static_cast<float>(Byte(mw[0][1], t))),
                                __float_as_uint(static_cast<float>(Byte(mw[1][1], t)))};
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) {
          if (nb < nbs) {
            const float4 bm = reinterpret_cast<const float4*>(s_sumx)[(sb * kNB + nb) * 32 + lane];
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            MmaTf32(c, am, __float_as_uint(bm.x), __float_as_uint(bm.y));
            MmaTf32(c, am, __float_as_uint(bm.z), __float_as_uint(bm.w));
#pragma unroll
            for (int e = 0; e < 4; ++e) accm[nb][e] = fmaf(dmin[e >> 1], c[e], accm[nb][e]);
          }
        }
      }
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
        if (nb < nbs) {
          const float2 s = *reinterpret_cast<const float2*>(s_scale + sb * kT + 8 * nb + 2 * t);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float v = fmaf(static_cast<float>(ilo[nb][e]), 1.0f / 64, static_cast<float>(ihi[nb][e]));
            acc[nb][e] = fmaf(d[e >> 1] * ((e & 1) != 0 ? s.y : s.x), v, acc[nb][e]);
          }
        }
      }
    }
    if (sb != KB - 1) return;
    // Last super-block of the unit: element e of n8 block nb is (weight row g + 8·(e >> 1), slot
    // 8·nb + 2t + (e & 1)).
    if constexpr (kMode != kLoadOnly) {
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
        if (nb < nbs) {
          float v[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) v[e] = acc[nb][e] - accm[nb][e];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int r = 8 * nb + 2 * t + c;
            if (r < rows) {
              float* dst = out + (first_slot + r) * out_cols;
              if constexpr (kGateUp) {
                dst[chunk * (kUnitRows / 2) + warp * 8 + g] = SiluTimes(v[c], v[2 + c]);
              } else {
                const int n = chunk * kUnitRows + warp * 16 + g;
                dst[n] = v[c];
                dst[n + 8] = v[2 + c];
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nb][e] = accm[nb][e] = 0.0f;
    }
  };

#pragma unroll 1
  for (int f = 0; f < kStages - 1; ++f) issue(f);
#pragma unroll 1
  for (int f = 0; f < total; ++f) {
    CpAsyncWait<kStages - 2>();
    __syncwarp();  // every lane's copies of item f are visible; every lane is done with item f - 1
    issue(f + kStages - 1);
    compute(f);
  }
  CpAsyncWait<0>();
}

// One warp per 256 elements of a row: 8 per lane, sub-block j = lane / 4 (mmq_quantize.cuh, the
// body the stream norm's folded quantization runs too). Launched with PDL (the wait first).
__global__ void QuantizeKernel(const float* __restrict__ x, int64_t rows, int K, MmqActivations q) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int KB = K / 256;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (w >= rows * KB) return;
  const int64_t row = w / KB;
  const int sb = static_cast<int>(w % KB);
  const int64_t base = row * K + sb * 256 + lane * 8;
  const float4 v0 = *reinterpret_cast<const float4*>(x + base);
  const float4 v1 = *reinterpret_cast<const float4*>(x + base + 4);
  const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  mmq_quantize::QuantizeGroup(v, lane, row, sb, K, q.hi, q.lo, q.scale, q.sumx);
}

template <bool kGateUp, int kNB, int kWarps, int kStages, int kMode, bool kTf32Min = true>
cudaError_t LaunchKernel(const PrefillTile* tiles, int num_tiles, MmqActivations a, const int32_t* a_index, int K,
                         int N, int out_cols, float* out, cudaStream_t stream) {
  constexpr int kT = 8 * kNB;
  if (N % (16 * kWarps) != 0) return cudaErrorInvalidValue;
  const int smem = ActSmemBytes(kT, K, kTf32Min) + kWarps * kStages * kStageBytes;
  if (smem > kSmemLimit) return cudaErrorInvalidValue;
  constexpr auto kernel = MmqQ4KKernel<kGateUp, kNB, kWarps, kStages, kMode, kTf32Min>;
  const int64_t units = static_cast<int64_t>(num_tiles) * (N / (16 * kWarps));
  int64_t blocks = 0;
  if (cudaError_t e = mmq_device::PersistentBlocks<kernel>(kWarps * 32, smem, units, &blocks); e != cudaSuccess) {
    return e;
  }
  kernel<<<static_cast<unsigned>(blocks), kWarps * 32, smem, stream>>>(tiles, num_tiles, a, a_index, K, N, out_cols,
                                                                         out);
  return cudaGetLastError();
}

// Tiles of up to 16 slots: 8 warps with rings of 8 stages (147 KB + 69 KB of activations at K =
// 2048) or 16 warps with 4; up to 32: 8 warps with 4 (74 KB + 138 KB).
template <bool kGateUp>
cudaError_t Launch(PrefillKernel kernel, int tile_rows, const PrefillTile* tiles, int num_tiles, MmqActivations a,
                   const int32_t* a_index, int K, int N, int out_cols, float* out, cudaStream_t stream,
                   const int* tile_count) {
  if (!IsMmqKernel(kernel) || tile_rows < 1 || tile_rows > kMmqMaxTileRows) return cudaErrorInvalidValue;
  // A device-side tile count: only the lean kernels read one.
  if (tile_count != nullptr && kernel != PrefillKernel::kMmqLean && kernel != PrefillKernel::kMmqLeanWarps8 &&
      kernel != PrefillKernel::kMmqLean2) {
    return cudaErrorInvalidValue;
  }
  if (K <= 0 || K % 256 != 0 || K > kMmqMaxK || N <= 0) return cudaErrorInvalidValue;
  if (num_tiles <= 0) return cudaSuccess;
  const bool small = tile_rows <= 16;
  switch (kernel) {
    case PrefillKernel::kMmqLean2:
      return LaunchMmqLean2(kGateUp, tile_rows, tiles, num_tiles, a, a_index, K, N, out_cols, out, stream, tile_count);
    case PrefillKernel::kMmqLean:
    case PrefillKernel::kMmqLeanWarps8:
      return LaunchMmqLean(kGateUp, kernel == PrefillKernel::kMmqLean ? 16 : 8, tile_rows, tiles, num_tiles, a, a_index,
                           K, N, out_cols, out, stream, tile_count);
    case PrefillKernel::kMmq:
      return small ? LaunchKernel<kGateUp, 2, 8, 8, kFull>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream)
                   : LaunchKernel<kGateUp, 4, 8, 4, kFull>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream);
    case PrefillKernel::kMmqF32Min:
      return small ? LaunchKernel<kGateUp, 2, 8, 8, kFull, false>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream)
                   : LaunchKernel<kGateUp, 4, 8, 4, kFull, false>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream);
    case PrefillKernel::kMmqWarps16:
      if (!small) return cudaErrorInvalidValue;
      return LaunchKernel<kGateUp, 2, 16, 4, kFull>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream);
    case PrefillKernel::kMmqWarps4:
      if (!small) return cudaErrorInvalidValue;
      return LaunchKernel<kGateUp, 2, 4, 16, kFull>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream);
    case PrefillKernel::kMmqL2Prefetch:
      return small ? LaunchKernel<kGateUp, 2, 8, 8, kFullL2Prefetch>(tiles, num_tiles, a, a_index, K, N, out_cols, out,
                                                                     stream)
                   : LaunchKernel<kGateUp, 4, 8, 4, kFullL2Prefetch>(tiles, num_tiles, a, a_index, K, N, out_cols, out,
                                                                     stream);
    case PrefillKernel::kMmqHiOnly:
      if (!small) return cudaErrorInvalidValue;
      return LaunchKernel<kGateUp, 2, 8, 8, kHiOnly>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream);
    case PrefillKernel::kMmqLoadOnly:
      if (!small) return cudaErrorInvalidValue;
      return LaunchKernel<kGateUp, 2, 8, 8, kLoadOnly>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream);
    case PrefillKernel::kMmqMathOnly:
      if (!small) return cudaErrorInvalidValue;
      return LaunchKernel<kGateUp, 2, 8, 8, kMathOnly>(tiles, num_tiles, a, a_index, K, N, out_cols, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace
}  // namespace prefill_mmq

size_t MmqActivationBytes(int64_t rows, int K) {
  return static_cast<size_t>(rows) * static_cast<size_t>(2 * K + (K / 256) * 4 + (K / 32) * 4);
}

MmqActivations MmqActivationPlanes(void* base, int64_t rows, int K) {
  auto* p = static_cast<int8_t*>(base);
  const int64_t n = rows * K;
  return MmqActivations{p, p + n, reinterpret_cast<float*>(p + 2 * n),
                        reinterpret_cast<float*>(p + 2 * n) + rows * (K / 256)};
}

cudaError_t LaunchMmqQuantize(const float* x, int64_t rows, int K, MmqActivations q, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (K <= 0 || K % 256 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0) return cudaErrorInvalidValue;
  const int64_t warps = rows * (K / 256);
  return LaunchPdl(prefill_mmq::QuantizeKernel, static_cast<unsigned>((warps + 7) / 8), 256, 0, stream, x, rows, K, q);
}

cudaError_t LaunchMmqGateUp(PrefillKernel kernel, int tile_rows, const PrefillTile* tiles, int num_tiles,
                            MmqActivations x, const int32_t* index, int h, int inner, float* act, cudaStream_t stream,
                            const int* tile_count) {
  return prefill_mmq::Launch<true>(kernel, tile_rows, tiles, num_tiles, x, index, h, 2 * inner, inner, act, stream,
                                   tile_count);
}

cudaError_t LaunchMmqDown(PrefillKernel kernel, int tile_rows, const PrefillTile* tiles, int num_tiles,
                          MmqActivations act, int h, int inner, float* partial, cudaStream_t stream,
                          const int* tile_count) {
  return prefill_mmq::Launch<false>(kernel, tile_rows, tiles, num_tiles, act, nullptr, inner, h, h, partial, stream,
                                    tile_count);
}

}  // namespace tandem::cuda
