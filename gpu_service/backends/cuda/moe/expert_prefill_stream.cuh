// Device code of the streamed Q4_K prefill GEMM (PrefillKernel::kStreamed; expert_prefill.cu
// includes this header and launches it; no host code).
//
// Why a second kernel: the tile kernel (expert_prefill_gemm.cuh) dequantizes a weight tile into
// shared memory as f16 and reads it back with ldmatrix, and keeps its raw weight bytes in
// registers two 64-deep steps ahead: at 512 tokens (about 10 rows per expert) it reached about a
// quarter of the HBM ceiling, with little in flight and much issue work per weight element. Here:
//  - raw Q4_K bytes go global -> shared through a cp.async ring (no registers held; 4 stages for
//    tiles of up to 64 slots, 6 for up to 32: 30 or 50 KB of weights per block in flight while a
//    stage is computed);
//  - each warp dequantizes the raw bytes straight into its mma B fragments (no f16 weight tile in
//    shared memory, no ldmatrix for B): thread (g, t) of a warp holds B row g, k slots 2t, 2t + 1
//    and 2t + 8, 2t + 9 of every 16-deep MMA, i.e. bytes 2t, 2t + 1 of every 8 quant bytes, whose
//    low nibbles feed one MMA and high nibbles (the next sub-block) another;
//  - the kernel is persistent: a grid of at most (blocks per SM x SMs) blocks, each walking its
//    units (one tile of up to 64 slots x 128 B rows, over all of K) with the ring flowing across
//    unit boundaries, so no block pays a pipeline prologue per unit. Which units a block walks is
//    the work order (StreamedWorkOrder, below); the unit index is tile * col_blocks + col in every
//    order, and each unit writes its own outputs with the same arithmetic, so every order gives
//    bit-identical results.
//
// Geometry: 256 threads = 8 warps; warp w owns B rows 16w .. 16w + 15 of the unit (two n8 blocks)
// and every slot of the tile (1 to 4, or 1 to 2, m16 fragments, chosen per tile from its rows at
// run time).
// A stage is 128 deep (half a Q4_K super-block): per B row the 16-byte head (d, dmin, scales) and
// 64 quant bytes (80 bytes), and the tile's activations [64 or 32 slots][128] f16 (rows of 256 bytes,
// 16-byte chunks XOR-swizzled by row so that ldmatrix's eight rows hit eight bank groups).
//
// Values: a weight is f16(d·sc)·q + f16(−dmin·m) in one f16 fused multiply-add, the same
// arithmetic as the tile kernel's Q4_K loader (so both kernels see identical f16 weights); q comes
// out of the quant byte exactly as (0x6400 | q) − 1024 (low nibble) and (0x5400 | q << 4) − 64 (high
// nibble), and the two factors as f16(d)·f16(sc) and f16(−dmin)·f16(m), each rounded once as in the
// f32 product rounded to f16.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_STREAM_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_STREAM_CUH_

#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda::prefill_stream {

constexpr int kThreads = 256;
constexpr int kUnitCols = kStreamedUnitCols;  // B rows of one unit (gate/up interleaved rows, or down rows)
static_assert(kUnitCols == 128, "eight warps of two n8 blocks");
constexpr int kStageK = 128;  // half a Q4_K super-block
constexpr int kQ4KBlockBytes = 144;
constexpr int kRawRowBytes = 80;         // 16-byte head + 64 quant bytes
constexpr int kARowBytes = kStageK * 2;  // 128 f16
constexpr int kBBytes = kUnitCols * kRawRowBytes;         // 10 KB
constexpr int kBTasks = kUnitCols * (kRawRowBytes / 16);  // 640 16-byte copies per stage
constexpr int kBLoads = (kBTasks + kThreads - 1) / kThreads;

// The ring for tiles of up to kMaxRows slots (64: four m16 fragments; 32: two). The activation
// part of a stage scales with kMaxRows; with 32 the shared memory of two blocks per SM holds six
// stages instead of four, so five stages of weights (not three) are in flight while one is computed.
template <int kMaxRows>
struct Ring {
  static_assert(kMaxRows == 32 || kMaxRows == 64, "tiles of up to 32 or 64 slots");
  static constexpr int kStages = kMaxRows == 64 ? 4 : 6;
  static constexpr int kABytes = kMaxRows * kARowBytes;  // 16 or 8 KB
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kMetaOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = kMetaOffset + kStages * 16;
  static constexpr int kALoads = kMaxRows * (kARowBytes / 16) / kThreads;  // 4 or 2
  static constexpr int kFrags = kMaxRows / 16;
};
static_assert(kStreamedMaxTileRows == 64, "the largest ring holds tiles of 64 slots");
static_assert(2 * Ring<64>::kSmemBytes <= 227 * 1024 && 2 * Ring<32>::kSmemBytes <= 227 * 1024, "two blocks per SM");

__device__ __forceinline__ uint32_t AOffset(int row, int chunk) {
  return static_cast<uint32_t>(row * kARowBytes + ((chunk ^ (row & 7)) << 4));
}

// CpAsync16 (cp_async.cuh), asking L2 to fetch the whole aligned 256 bytes around the source from
// DRAM.
__device__ __forceinline__ void CpAsync16L2Lines256(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem) : "memory");
}

// (a & mask) | bits in one LOP3.
__device__ __forceinline__ uint32_t AndOr(uint32_t a, uint32_t mask, uint32_t bits) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(a), "r"(mask), "r"(bits));
  return r;
}

// half2(f16(d·sc_i), f16(−dmin·m_i)) for the four sub-blocks i of stage half `h` of the
// super-block whose head is `head` (UnpackKScaleMin of common/weights/block_layouts.h, four at a
// time: one byte per sub-block).
__device__ __forceinline__ void StageFactors(const uint4& head, int h, uint32_t (&fo)[4]) {
  uint32_t sc, m;
  if (h == 0) {
    sc = head.y & 0x3F3F3F3Fu;
    m = head.z & 0x3F3F3F3Fu;
  } else {
    sc = (head.w & 0x0F0F0F0Fu) | ((head.y >> 2) & 0x30303030u);
    m = ((head.w >> 4) & 0x0F0F0F0Fu) | ((head.z >> 2) & 0x30303030u);
  }
  const __half2 d_neg_dmin = AsHalf2(head.x ^ 0x80000000u);
  const __half2 k1024 = __float2half2_rn(1024.0f);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // Bytes: sc_i, sc_i, m_i, m_i; the high byte of each half is replaced by 0x64: 1024 + value.
    const uint32_t pair = __byte_perm(sc, m, static_cast<uint32_t>(i | (i << 4) | ((4 + i) << 8) | ((4 + i) << 12)));
    const __half2 scm = __hsub2(AsHalf2(AndOr(pair, 0x00FF00FFu, 0x64006400u)), k1024);
    fo[i] = Half2Bits(__hmul2(d_neg_dmin, scm));
  }
}

// Two weights as one f16 pair: bytes 0 and 2 of `pair`, low (kHigh false) or high nibbles, scaled
// by fo = half2(factor, offset).
template <bool kHigh>
__device__ __forceinline__ uint32_t DequantNibblePair(uint32_t pair, uint32_t fo) {
  const __half2 f = AsHalf2(fo);
  __half2 q;
  if constexpr (kHigh) {
    q = __hsub2(AsHalf2(AndOr(pair, 0x00F000F0u, 0x54005400u)), __float2half2_rn(64.0f));
  } else {
    q = __hsub2(AsHalf2(AndOr(pair, 0x000F000Fu, 0x64006400u)), __float2half2_rn(1024.0f));
  }
  return Half2Bits(__hfma2(__low2half2(f), q, __high2half2(f)));
}

// The B fragment word of two weights: bytes 2t, 2t + 1 of the 8 quant bytes (lo, hi) selected by
// `sel`, low (kHigh false) or high nibbles, scaled by fo = half2(factor, offset).
template <bool kHigh>
__device__ __forceinline__ uint32_t Dequant2(uint32_t lo, uint32_t hi, uint32_t sel, uint32_t fo) {
  return DequantNibblePair<kHigh>(__byte_perm(lo, hi, sel), fo);
}

__device__ __forceinline__ float SiluTimes(float g, float u) { return g * (1.0f / (1.0f + expf(-g))) * u; }

// How the persistent blocks take their units (the unit index is tile * col_blocks + col, and the
// tiles of one expert are consecutive, so an expert's units for one 128-row weight block are at
// most col_blocks apart in the index):
//  - kRanges (the backend's order until 2026-12-01): block b walks the contiguous
//    range [U·b/G, U·(b+1)/G). The G blocks then run units about U/G apart at any moment, so at
//    8192 tokens (3 tiles an expert, U/G ~ 47) a block re-reads an expert's weight block for its
//    next tile 8 units later, after the other blocks streamed ~300 MB through L2: each expert's
//    weights come from HBM once per tile (moe/PERF_NOTES.md, "work order": 3x at 8192 tokens).
//  - kStrided: block b walks units b, b + G, b + 2G, ...: at any moment the blocks run about G
//    consecutive units, so an expert's tiles read a weight block at about the same time (L2
//    serves all but the first); but blocks drift apart (SMs run at different speeds), which the L2
//    model says loses much of the gain (1.8-2x the weight bytes at 8192 tokens).
//  - kDynamic (the default): block b starts with unit b, then takes G + a global counter's next
//    value at each unit boundary, so the units in flight stay a window of about 2G consecutive
//    indices whatever the blocks' speeds (weights read about once at every size in the model) and
//    the work balances itself across SMs. The counter (two ints: next unit, blocks done) must be 0
//    at launch; the last block to finish sets it back to 0, so one counter serves every launch in
//    stream order.
enum StreamedWorkOrder : int { kOrderRanges = 0, kOrderStrided = 1, kOrderDynamic = 2 };

// Weight prefetch variants (PrefillKernel): kStreamed issues only the ring's 16-byte copies, each
// a separate 80-byte piece of a B row per stage (rows 1152 bytes apart at K = 2048), so DRAM sees
// short scattered reads; kStreamedL2Lines256 has L2 fetch the aligned 256 bytes around each copy;
// kStreamedUnitPrefetch has the copy engine prefetch every B row of a unit (the whole row,
// contiguous) into L2 when the producer enters the unit.
//
// tiles: rows <= kMaxRows each. a: f16 rows of K elements; a_index maps a slot to its row of a (nullptr:
// the slot itself). B rows n < N (N a multiple of 128; gate/up: N = 2·inner, row 2f gate row f and
// 2f + 1 up row f; down: N = h). K a multiple of 256. out_cols: inner (gate/up) or h.
template <bool kGateUp, PrefillKernel kVariant, int kMaxRows>
__global__ void __launch_bounds__(kThreads, 2)
    StreamedQ4KGemmKernel(const PrefillTile* __restrict__ tiles, int num_tiles, const uint16_t* __restrict__ a,
                          const int32_t* __restrict__ a_index, int K, int N, int out_cols,
                          uint16_t* __restrict__ act_out, float* __restrict__ f32_out,
                          const int* __restrict__ tile_count, int order, int* __restrict__ work_counter) {
  // pdl.cuh: the tiles, their count, the activations and the work counter are the step's.
  PdlWaitForPrevious();
  PdlAllowNext();
  // A device-planned call: the tiles were counted on the device; num_tiles is their bound.
  if (tile_count != nullptr) num_tiles = min(num_tiles, *tile_count);
  using R = Ring<kMaxRows>;
  constexpr int kStages = R::kStages, kABytes = R::kABytes, kALoads = R::kALoads, kFrags = R::kFrags;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_base = SmemAddr(smem);
  int4* meta = reinterpret_cast<int4*>(smem + R::kMetaOffset);  // per stage: first_slot, rows, n0, last k-stage
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int col_blocks = N / kUnitCols;
  const int64_t units = static_cast<int64_t>(num_tiles) * col_blocks;
  const int ksteps = K / kStageK;  // >= 2 (K a multiple of 256): the dynamic order relies on it
  const int64_t row_bytes = static_cast<int64_t>(K / 256) * kQ4KBlockBytes;
  const bool dynamic = order == kOrderDynamic;
  // This block's units: kRanges [u_begin, u_end) step 1; kStrided from blockIdx.x step gridDim.x;
  // kDynamic from the counter (total unknown until the counter runs past `units`: the producer
  // then sets it, before the consumer reaches that stage).
  int64_t u_begin = 0, u_step = 1;
  int total = INT_MAX;  // stages this block computes
  if (order == kOrderStrided) {
    u_begin = blockIdx.x;
    u_step = gridDim.x;
    total = units > u_begin ? static_cast<int>((units - 1 - u_begin) / u_step + 1) * ksteps : 0;
  } else if (!dynamic) {
    u_begin = units * blockIdx.x / gridDim.x;
    total = static_cast<int>(units * (blockIdx.x + 1) / gridDim.x - u_begin) * ksteps;
  }
  // kDynamic: block b's first unit is b (no atomic, no wait at the start); the counter hands out
  // the units from G on. The unit index of this block's n-th unit (n >= 1) is in next_unit[n & 1]:
  // thread 0 takes unit n + 1 from the counter when unit n starts (pending) and stores it into
  // shared memory at unit n's last k-stage, so the atomic's round trip hides behind ksteps - 1
  // stages; the main loop's barrier between that issue and the next one publishes it (prologue:
  // see below).
  __shared__ int next_unit[2];
  int pending = 0;
  int p_count = 0;  // units this block has started

  // ---- Producer: stage f of this block is k-stage p_ks of unit p_unit.
  int64_t p_unit = u_begin;
  int p_ks = 0;
  PrefillTile p_tile{};
  const uint8_t* b_src[kBLoads];  // B row base of each of this thread's copies (nullptr: none)
  const uint16_t* a_src[kALoads];
  // Copy i of the B ring: task tid + 256·i = (row, piece) with piece 0 the head.
  auto setup_unit = [&] {
    p_tile = tiles[p_unit / col_blocks];
    const int n0 = static_cast<int>(p_unit % col_blocks) * kUnitCols;
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const int task = tid + i * kThreads;
      b_src[i] = nullptr;
      if (task < kBTasks) {
        const int n = n0 + task / 5;
        if constexpr (kGateUp) {
          b_src[i] = static_cast<const uint8_t*>((n & 1) != 0 ? p_tile.up : p_tile.gate) + (n >> 1) * row_bytes;
        } else {
          b_src[i] = static_cast<const uint8_t*>(p_tile.down) + n * row_bytes;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int r = (tid >> 4) + 16 * i;
      a_src[i] = nullptr;
      if (r < p_tile.rows) {
        const int slot = p_tile.first_slot + r;
        const int64_t row = a_index != nullptr ? a_index[slot] : slot;
        a_src[i] = a + row * K + (tid & 15) * 8;
      }
    }
    if constexpr (kVariant == PrefillKernel::kStreamedUnitPrefetch) {
      if (tid < kUnitCols) {
        const int n = n0 + tid;
        const uint8_t* row;
        if constexpr (kGateUp) {
          row = static_cast<const uint8_t*>((n & 1) != 0 ? p_tile.up : p_tile.gate) + (n >> 1) * row_bytes;
        } else {
          row = static_cast<const uint8_t*>(p_tile.down) + n * row_bytes;
        }
        PrefetchL2(row, static_cast<uint32_t>(row_bytes));
      }
    }
  };
  auto issue = [&](int f) {
    if (f < total && p_ks == 0) {
      if (dynamic) {
        p_unit = p_count == 0 ? static_cast<int64_t>(blockIdx.x) : next_unit[p_count & 1];
        if (p_unit >= units) {
          total = f;  // every thread reads the same index: total stays uniform
        } else if (tid == 0) {
          pending = static_cast<int>(gridDim.x) + atomicAdd(work_counter, 1);
        }
      } else if (p_count > 0) {
        p_unit += u_step;
      }
      ++p_count;
    }
    if (f < total) {
      if (p_ks == 0) setup_unit();
      if (dynamic && tid == 0 && p_ks == ksteps - 1) next_unit[p_count & 1] = pending;
      const int slot = f % kStages;
      const uint32_t sa = smem_base + slot * (kABytes + kBBytes);
      const uint32_t sb = sa + kABytes;
      const int k0 = p_ks * kStageK;
#pragma unroll
      for (int i = 0; i < kALoads; ++i) {
        if (a_src[i] != nullptr) CpAsync16(sa + AOffset((tid >> 4) + 16 * i, tid & 15), a_src[i] + k0);
      }
      const int64_t block_off = static_cast<int64_t>(p_ks >> 1) * kQ4KBlockBytes;
      const int half_off = 64 * (p_ks & 1);
#pragma unroll
      for (int i = 0; i < kBLoads; ++i) {
        const int task = tid + i * kThreads;
        if (b_src[i] != nullptr) {
          const int piece = task % 5;
          const int off = piece == 0 ? 0 : 16 + half_off + 16 * (piece - 1);
          const uint32_t dst = sb + (task / 5) * kRawRowBytes + piece * 16;
          if constexpr (kVariant == PrefillKernel::kStreamedL2Lines256) {
            CpAsync16L2Lines256(dst, b_src[i] + block_off + off);
          } else {
            CpAsync16(dst, b_src[i] + block_off + off);
          }
        }
      }
      if (tid == 0) {
        meta[slot] = make_int4(p_tile.first_slot, p_tile.rows, static_cast<int>(p_unit % col_blocks) * kUnitCols,
                               p_ks == ksteps - 1 ? 1 : 0);
      }
      if (++p_ks == ksteps) p_ks = 0;
    }
    CpAsyncCommit();  // empty groups past the end keep the wait count uniform
  };

  // ---- Consumer.
  const int g = lane >> 2, t = lane & 3;
  // Byte selector of Dequant2: bytes 2t, 2t, 2t + 1, 2t + 1 of the 8 quant bytes.
  const uint32_t sel = static_cast<uint32_t>((2 * t) | ((2 * t) << 4) | ((2 * t + 1) << 8) | ((2 * t + 1) << 12));
  float acc[kFrags][2][4];
  auto clear_acc = [&] {
#pragma unroll
    for (int mf = 0; mf < kFrags; ++mf) {
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mf][nb][q] = 0.0f;
      }
    }
  };
  clear_acc();

  auto compute = [&](int f) {
    const int slot = f % kStages;
    const int4 m = meta[slot];
    const int rows = m.y, frags = (m.y + 15) >> 4;
    // k-stage of f within its unit: every unit has ksteps stages, and the block's stages start at a unit.
    const int ks = f % ksteps;
    const uint32_t sa = smem_base + slot * (kABytes + kBBytes);
    const uint8_t* sb = smem + slot * (kABytes + kBBytes) + kABytes;
    uint32_t fo[2][4];
    const uint8_t* raw[2];
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      raw[nb] = sb + (warp * 16 + nb * 8 + g) * kRawRowBytes;
      StageFactors(*reinterpret_cast<const uint4*>(raw[nb]), ks & 1, fo[nb]);
    }
#pragma unroll
    for (int s2 = 0; s2 < 2; ++s2) {
      // B fragments of the four 16-deep MMAs of 64-deep step s2: kk 0, 1 low nibbles of quant
      // bytes 0-15, 16-31 (sub-block 2·s2 of the stage), kk 2, 3 their high nibbles (2·s2 + 1).
      uint32_t b[2][4][2];
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        const uint4 q0 = *reinterpret_cast<const uint4*>(raw[nb] + 16 + 32 * s2);
        const uint4 q1 = *reinterpret_cast<const uint4*>(raw[nb] + 32 + 32 * s2);
        const uint32_t flo = fo[nb][2 * s2], fhi = fo[nb][2 * s2 + 1];
        b[nb][0][0] = Dequant2<false>(q0.x, q0.y, sel, flo);
        b[nb][0][1] = Dequant2<false>(q0.z, q0.w, sel, flo);
        b[nb][1][0] = Dequant2<false>(q1.x, q1.y, sel, flo);
        b[nb][1][1] = Dequant2<false>(q1.z, q1.w, sel, flo);
        b[nb][2][0] = Dequant2<true>(q0.x, q0.y, sel, fhi);
        b[nb][2][1] = Dequant2<true>(q0.z, q0.w, sel, fhi);
        b[nb][3][0] = Dequant2<true>(q1.x, q1.y, sel, fhi);
        b[nb][3][1] = Dequant2<true>(q1.z, q1.w, sel, fhi);
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int kc = 4 * s2 + kk;  // 16-deep chunk of the stage: A chunks 2kc, 2kc + 1
#pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
          if (mf < frags) {
            uint32_t af[4];
            LdMatrixX4(af, sa + AOffset(mf * 16 + (lane & 15), 2 * kc + (lane >> 4)));
#pragma unroll
            for (int nb = 0; nb < 2; ++nb) MmaF16(acc[mf][nb], af, b[nb][kk][0], b[nb][kk][1]);
          }
        }
      }
    }
    if (m.w == 0) return;
    // Last k-stage of the unit: accumulator (mf, nb) holds c0, c1 at (slot row g, B rows 2t,
    // 2t + 1 of the n8 block) and c2, c3 at row g + 8.
    const int64_t first_slot = m.x;
#pragma unroll
    for (int mf = 0; mf < kFrags; ++mf) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mf * 16 + g + half * 8;
        if (mf < frags && r < rows) {
          const int64_t s = first_slot + r;
#pragma unroll
          for (int nb = 0; nb < 2; ++nb) {
            const int col = m.z + warp * 16 + nb * 8 + 2 * t;
            const float v0 = acc[mf][nb][2 * half], v1 = acc[mf][nb][2 * half + 1];
            if constexpr (kGateUp) {
              act_out[s * out_cols + (col >> 1)] = __half_as_ushort(__float2half_rn(SiluTimes(v0, v1)));
            } else {
              *reinterpret_cast<float2*>(f32_out + s * out_cols + col) = make_float2(v0, v1);
            }
          }
        }
      }
    }
    clear_acc();
  };

#pragma unroll 1
  for (int f = 0; f < kStages - 1; ++f) {
    issue(f);
    // kDynamic: a unit boundary may fall inside the prologue (ksteps 4 < 5 stages of the 6-stage
    // ring): thread 0's store of the next index must be visible before the next issue reads it.
    if (dynamic) __syncthreads();
  }
  // total is final for every stage the loop reaches: issue(f) ran kStages - 1 iterations before
  // the check of f, and the dynamic producer sets total at the first stage past its last unit.
#pragma unroll 1
  for (int f = 0; f < total; ++f) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    // Slot (f − 1) % kStages was computed in iteration f − 1, which every thread has left.
    issue(f + kStages - 1);
    compute(f);
  }
  CpAsyncWait<0>();
  if (dynamic && tid == 0) {
    // Thread 0's last atomicAdd on the counter, if any, has returned (its value ended the loop
    // above). The last block to get here sets the counter back to 0 for the next launch.
    __threadfence();
    if (atomicAdd(work_counter + 1, 1) == static_cast<int>(gridDim.x) - 1) {
      atomicExch(work_counter, 0);
      atomicExch(work_counter + 1, 0);
    }
  }
}

}  // namespace tandem::cuda::prefill_stream

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_STREAM_CUH_
