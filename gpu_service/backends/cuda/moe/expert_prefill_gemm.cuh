// Device code of the grouped prefill GEMMs (expert_prefill.cu includes this header; no host code):
// the shared-memory tile helpers and the software-pipelined kernel of PrefillKernel::kPipelined.
//
// One block computes `kBM` slot rows of one row tile × kPrefillTileCols weight rows (B rows) in
// 64-deep k-steps, with two shared-memory stages and one __syncthreads per step. Eight warps split
// the tile (kWarpsM × kWarpsN); each issues mma.m16n8k16 (f16 in, f32 accumulate) on fragments read
// with ldmatrix. Every shared tile is [rows][64] f16, rows of 128 bytes whose eight 16-byte chunks
// are XOR-swizzled by the row so that the eight addresses of one ldmatrix matrix hit eight bank
// groups. In the gate/up launch B row 2f is gate row f and B row 2f + 1 is up row f, so the
// accumulator pair (c0, c1) a thread holds is (gate, up) of one feature and SiLU·up is applied in
// registers.
//
// The pipeline (why it was 1.45-1.6x faster than the unpipelined kernel it replaced, whose every
// step waited for its weight loads before its MMAs): during step s the block
//   - copies the activation tile of step s + 1 with cp.async (no registers, no wait until the end),
//   - runs the MMAs of step s,
//   - converts the raw weight bytes of step s + 1, loaded into registers two steps earlier, to f16
//     in the other shared stage, and issues the raw loads of step s + 3,
// so every raw weight load has two whole steps to arrive. Formats with a split loader
// (StepWeights specializations; Q4_K today) get this; the others dequantize with DequantChunk at
// the conversion point (their loads are not issued ahead).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_GEMM_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_GEMM_CUH_

#include <cuda_fp16.h>

#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda::prefill_gemm {

constexpr int kGemmThreads = 256;
constexpr int kTileK = 64;
constexpr int kSmemRowBytes = kTileK * 2;

__device__ __forceinline__ uint16_t ToF16Bits(float v) { return __half_as_ushort(__float2half_rn(v)); }

__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk) {
  return static_cast<uint32_t>(row * kSmemRowBytes + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ float SiluTimes(float g, float u) { return g * (1.0f / (1.0f + expf(-g))) * u; }

// Writes 32 f16 (16 words) as four 16-byte chunks of one swizzled shared row.
__device__ __forceinline__ void StoreChunks(uint8_t* s_tile, int row, const int (&chunk)[4], const uint32_t (&w)[16]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    *reinterpret_cast<uint4*>(s_tile + SwizzledOffset(row, chunk[j])) =
        make_uint4(w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]);
  }
}

// One thread's share of a 64-deep step of one B row: 32 of the 64 elements (`half` 0 or 1).
// Load(row, step, half) issues the global loads (for formats that can), Store converts them to
// f16 in the shared B tile. Generic formats: nothing is loaded ahead; Store dequantizes 32-element
// chunk 2·step + half with DequantChunk (values rounded to f16 once) into chunks 4·half .. 4·half + 3.
template <uint32_t kType>
struct StepWeights {
  __device__ __forceinline__ void Load(const uint8_t*, int, int) {}
  __device__ __forceinline__ void Store(const uint8_t* row, int step, int half, int k_chunks, uint8_t* s_tile,
                                        int s_row) const {
    uint32_t packed[16];
    const int c = 2 * step + half;
    if (row != nullptr && c < k_chunks) {
      float v[32];
      DequantChunk<kType>(row, c, v);
#pragma unroll
      for (int k = 0; k < 16; ++k) packed[k] = PackF16x2(v[2 * k], v[2 * k + 1]);
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) packed[k] = 0;
    }
    const int chunks[4] = {4 * half, 4 * half + 1, 4 * half + 2, 4 * half + 3};
    StoreChunks(s_tile, s_row, chunks, packed);
  }
};

// Q4_K: a 64-deep step is the 32 quant bytes qs[32·(step % 4) ..] of super-block step / 4 (low
// nibbles: elements 0-31 of the step, sub-block 2·(step % 4); high nibbles: elements 32-63, the
// next sub-block). Thread `half` takes quant bytes 16·half .. 16·half + 15 (elements 16·half + l
// and 32 + 16·half + l) plus the 16-byte head (d, dmin, scales): two 16-byte loads, 8 registers.
// Conversion in f16x2 arithmetic: (0x6400 | q) is the f16 1024 + q, so q = that − 1024 exactly,
// and w = f16(d·sc)·q − f16(dmin·m) in one fused multiply-add. The weights then differ from
// DequantizeRow's value rounded to f16 by about one f16 ulp of d·sc·q and of dmin·m (the
// rounding of the two factors): the same class of error as the f16 operands themselves.
template <>
struct StepWeights<kTypeQ4_K> {
  uint4 head;
  uint4 q;
  __device__ __forceinline__ void Load(const uint8_t* row, int step, int half) {
    if (row == nullptr) return;
    const uint8_t* blk = row + (step >> 2) * 144;
    head = __ldg(reinterpret_cast<const uint4*>(blk));
    q = __ldg(reinterpret_cast<const uint4*>(blk + 16 + 32 * (step & 3) + 16 * half));
  }
  // Byte k (0 .. 11) of the 12 scale bytes (head bytes 4 .. 15), from registers (indexing the
  // bytes of `head` through a pointer would put it in local memory).
  __device__ __forceinline__ int ScaleByte(int k) const {
    const uint32_t word = k < 4 ? head.y : (k < 8 ? head.z : head.w);
    return static_cast<int>((word >> (8 * (k & 3))) & 0xFF);
  }
  // UnpackKScaleMin (common/weights/block_layouts.h) on the bytes of ScaleByte.
  __device__ __forceinline__ void ScaleMin(int j, int* scale, int* min) const {
    if (j < 4) {
      *scale = ScaleByte(j) & 63;
      *min = ScaleByte(j + 4) & 63;
    } else {
      *scale = (ScaleByte(j + 4) & 0xF) | ((ScaleByte(j - 4) >> 6) << 4);
      *min = (ScaleByte(j + 4) >> 4) | ((ScaleByte(j) >> 6) << 4);
    }
  }
  __device__ __forceinline__ void Store(const uint8_t* row, int step, int half, int /*k_chunks*/, uint8_t* s_tile,
                                        int s_row) const {
    uint32_t lo[8], hi[8];
    if (row != nullptr) {
      const int j = 2 * (step & 3);
      int sc_lo, m_lo, sc_hi, m_hi;
      ScaleMin(j, &sc_lo, &m_lo);
      ScaleMin(j + 1, &sc_hi, &m_hi);
      const float d = HalfBits(static_cast<uint16_t>(head.x & 0xFFFF));
      const float dmin = HalfBits(static_cast<uint16_t>(head.x >> 16));
      const __half2 f_lo = __float2half2_rn(d * sc_lo), o_lo = __float2half2_rn(-dmin * m_lo);
      const __half2 f_hi = __float2half2_rn(d * sc_hi), o_hi = __float2half2_rn(-dmin * m_hi);
      const __half2 k1024 = __float2half2_rn(1024.0f);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          // Bytes 2p and 2p + 1 of the word in the two 16-bit lanes (elements 4i + 2p, 4i + 2p + 1).
          const uint32_t pair = __byte_perm(words[i], 0, p == 0 ? 0x4140 : 0x4342);
          const uint32_t lo_bits = (pair & 0x000F000Fu) | 0x64006400u;
          const uint32_t hi_bits = ((pair >> 4) & 0x000F000Fu) | 0x64006400u;
          lo[2 * i + p] = Half2Bits(__hfma2(f_lo, __hsub2(AsHalf2(lo_bits), k1024), o_lo));
          hi[2 * i + p] = Half2Bits(__hfma2(f_hi, __hsub2(AsHalf2(hi_bits), k1024), o_hi));
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) lo[k] = hi[k] = 0;
    }
    // Elements 16·half + 0..15 are chunks 2·half, 2·half + 1; 32 + 16·half + 0..15 are 4 + 2·half, 5 + 2·half.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      *reinterpret_cast<uint4*>(s_tile + SwizzledOffset(s_row, 2 * half + j)) =
          make_uint4(lo[4 * j], lo[4 * j + 1], lo[4 * j + 2], lo[4 * j + 3]);
      *reinterpret_cast<uint4*>(s_tile + SwizzledOffset(s_row, 4 + 2 * half + j)) =
          make_uint4(hi[4 * j], hi[4 * j + 1], hi[4 * j + 2], hi[4 * j + 3]);
    }
  }
};

template <int kBM>
constexpr int SmemBytes() {
  return 2 * (kBM + kPrefillTileCols) * kSmemRowBytes;
}

// Small tiles hold few accumulators: three blocks per SM keep more weight loads in flight. At 128
// rows, Q2_K's and Q5_K's DequantChunk plus 64 accumulators spill under the 128-register bound of
// two blocks: one block per SM for them.
template <uint32_t kType, int kBM>
constexpr int PipelinedMinBlocks() {
  if (kBM <= 32) return 3;
  return kBM == 128 && (kType == kTypeQ2_K || kType == kTypeQ5_K) ? 1 : 2;
}

// a: f16 rows of K elements; a_index maps a slot to its row of a (nullptr: the slot itself).
// B rows: n < N (gate/up: N = 2·inner, interleaved; down: N = h). out_cols: inner (gate/up) or h.
template <uint32_t kType, int kBM, bool kGateUp>
__global__ void __launch_bounds__(kGemmThreads, PipelinedMinBlocks<kType, kBM>())
    PipelinedGemmKernel(const PrefillTile* __restrict__ tiles, int col_blocks, const uint16_t* __restrict__ a,
                        const int32_t* __restrict__ a_index, int K, int N, int out_cols,
                        uint16_t* __restrict__ act_out, float* __restrict__ f32_out) {
  constexpr int kWarpsM = kBM >= 64 ? kBM / 32 : 1;
  constexpr int kWarpsN = (kGemmThreads / 32) / kWarpsM;
  constexpr int kWarpRows = kBM / kWarpsM;
  constexpr int kWarpCols = kPrefillTileCols / kWarpsN;
  constexpr int kMF = kWarpRows / 16;
  constexpr int kNF = kWarpCols / 8;
  static_assert(kWarpRows % 16 == 0 && kNF % 2 == 0, "warp tile must be whole m16 × (2 × n8) fragments");
  static_assert(kPrefillTileCols * 2 == kGemmThreads, "two threads per B row");
  constexpr int kABytes = kBM * kSmemRowBytes;
  constexpr int kStageBytes = kABytes + kPrefillTileCols * kSmemRowBytes;
  constexpr int kATasks = kBM * (kSmemRowBytes / 16);
  constexpr int kALoads = (kATasks + kGemmThreads - 1) / kGemmThreads;
  extern __shared__ __align__(128) uint8_t smem[];

  const int tile_index = static_cast<int>(blockIdx.x / col_blocks);
  const int n0 = static_cast<int>(blockIdx.x % col_blocks) * kPrefillTileCols;
  const PrefillTile tile = tiles[tile_index];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  // A: task tid + 256·i copies 16-byte chunk (tid % 8) of tile row (task / 8); null past the rows.
  const int a_chunk = tid & 7;
  const uint16_t* a_src[kALoads];
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int task = tid + i * kGemmThreads;
    const int r = task >> 3;
    a_src[i] = nullptr;
    if (task < kATasks && r < tile.rows) {
      const int slot = tile.first_slot + r;
      const int64_t row = a_index != nullptr ? a_index[slot] : slot;
      a_src[i] = a + row * K + a_chunk * 8;
    }
  }
  auto load_a = [&](int stage, int k0) {
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int task = tid + i * kGemmThreads;
      if (task < kATasks) {
        const uint32_t offset = stage * kStageBytes + SwizzledOffset(task >> 3, a_chunk);
        if (a_src[i] != nullptr && k0 + a_chunk * 8 < K) {
          CpAsync16(smem_base + offset, a_src[i] + k0);
        } else {
          *reinterpret_cast<uint4*>(smem + offset) = make_uint4(0, 0, 0, 0);
        }
      }
    }
  };

  // B: thread tid converts half (tid % 2) of each step of B row tid / 2.
  const int b_row_local = tid >> 1, b_half = tid & 1;
  const int64_t row_bytes = static_cast<int64_t>(K) / BlockGeometry<kType>::kElems * BlockGeometry<kType>::kBytes;
  const uint8_t* b_row = nullptr;
  if (const int n = n0 + b_row_local; n < N) {
    if constexpr (kGateUp) {
      b_row = static_cast<const uint8_t*>((n & 1) != 0 ? tile.up : tile.gate) + static_cast<int64_t>(n >> 1) * row_bytes;
    } else {
      b_row = static_cast<const uint8_t*>(tile.down) + static_cast<int64_t>(n) * row_bytes;
    }
  }
  const int k_chunks = K / 32;
  auto store_b = [&](const StepWeights<kType>& w, int stage, int step) {
    w.Store(b_row, step, b_half, k_chunks, smem + stage * kStageBytes + kABytes, b_row_local);
  };

  float acc[kMF][kNF][4];
#pragma unroll
  for (int mf = 0; mf < kMF; ++mf) {
#pragma unroll
    for (int nf = 0; nf < kNF; ++nf) {
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mf][nf][q] = 0.0f;
    }
  }
  auto mma_stage = [&](int stage) {
    const uint32_t sa = smem_base + stage * kStageBytes;
    const uint32_t sb = sa + kABytes;
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      // A fragment: matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15); lane l
      // addresses row l % 16 of k half l / 16.
      uint32_t af[kMF][4];
#pragma unroll
      for (int mf = 0; mf < kMF; ++mf) {
        LdMatrixX4(af[mf], sa + SwizzledOffset(wm * kWarpRows + mf * 16 + (lane & 15), kk * 2 + (lane >> 4)));
      }
      // B fragments of two n8 blocks: matrices (n 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15).
      uint32_t bf[kNF][2];
#pragma unroll
      for (int p = 0; p < kNF / 2; ++p) {
        uint32_t r[4];
        LdMatrixX4(r, sb + SwizzledOffset(wn * kWarpCols + p * 16 + (lane & 7) + ((lane >> 4) << 3),
                                          kk * 2 + ((lane >> 3) & 1)));
        bf[2 * p][0] = r[0];
        bf[2 * p][1] = r[1];
        bf[2 * p + 1][0] = r[2];
        bf[2 * p + 1][1] = r[3];
      }
#pragma unroll
      for (int mf = 0; mf < kMF; ++mf) {
#pragma unroll
        for (int nf = 0; nf < kNF; ++nf) MmaF16(acc[mf][nf], af[mf], bf[nf][0], bf[nf][1]);
      }
    }
  };

  // Register sets: w_odd holds the raw bytes of the next odd step, w_even of the next even step.
  const int steps = (K + kTileK - 1) / kTileK;
  StepWeights<kType> w_even, w_odd;
  w_even.Load(b_row, 0, b_half);
  if (steps > 1) w_odd.Load(b_row, 1, b_half);
  load_a(0, 0);
  store_b(w_even, 0, 0);
  if (steps > 2) w_even.Load(b_row, 2, b_half);
  CpAsyncWaitAll();
  __syncthreads();

  // Step s: stage s & 1 is complete; `next` holds the raw bytes of step s + 1.
  auto step = [&](int s, StepWeights<kType>& next) {
    // Stage (s + 1) & 1 was last read by step s − 1, which every thread finished before the barrier.
    if (s + 1 < steps) load_a((s + 1) & 1, (s + 1) * kTileK);
    mma_stage(s & 1);
    if (s + 1 < steps) {
      store_b(next, (s + 1) & 1, s + 1);
      if (s + 3 < steps) next.Load(b_row, s + 3, b_half);
    }
    CpAsyncWaitAll();
    __syncthreads();
  };
  for (int s = 0; s < steps; s += 2) {
    step(s, w_odd);
    if (s + 1 < steps) step(s + 1, w_even);
  }

  // Accumulator (mf, nf): c0, c1 at (row g, cols 2t, 2t + 1), c2, c3 at (row g + 8, same cols).
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mf = 0; mf < kMF; ++mf) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm * kWarpRows + mf * 16 + g + half * 8;
      if (r >= tile.rows) continue;
      const int64_t slot = tile.first_slot + r;
#pragma unroll
      for (int nf = 0; nf < kNF; ++nf) {
        const int col = n0 + wn * kWarpCols + nf * 8 + 2 * t;
        const float v0 = acc[mf][nf][2 * half], v1 = acc[mf][nf][2 * half + 1];
        if constexpr (kGateUp) {
          const int feature = col >> 1;
          if (feature < out_cols) act_out[slot * out_cols + feature] = ToF16Bits(SiluTimes(v0, v1));
        } else {
          float* o = f32_out + slot * out_cols + col;
          if (col + 1 < out_cols) {
            *reinterpret_cast<float2*>(o) = make_float2(v0, v1);  // out_cols even here: 8-byte aligned
          } else if (col < out_cols) {
            o[0] = v0;
          }
        }
      }
    }
  }
}

}  // namespace tandem::cuda::prefill_gemm

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_GEMM_CUH_
