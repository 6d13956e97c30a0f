// The warp-specialized weights-as-A wgmma Q4_K prefill GEMM (PrefillKernel::kWgmmaWs): kWgmma
// (expert_prefill_wgexp.cu; read its header comment first) with the copies moved to a producer
// warpgroup, so that the two consumer warpgroups only dequantize and issue wgmmas.
//
// Why: at 8192 tokens kWgmma is latency-bound (Nsight Compute: tensor pipe ~36% busy, 0.46
// eligible warps of 2 a scheduler). Each of its 8 warps, every 64-deep stage, issues ~6.5 cp.async
// a thread (slot-index lookups, 64-bit address math), waits for the copies, meets the other warps
// at a block barrier, dequantizes its 16 weight rows (~100 dependent instructions a thread) and
// issues 4 wgmmas. Taking out only the barrier (branch h/wgpipe, kWgmmaPipe) kept the bits and was
// 4% slower: the barrier is not the bound; the consumers' own instruction stream is.
//
// Geometry: 384 threads, one block an SM (__launch_bounds__(384, 1)).
//  - Warpgroup 0, the producer (setmaxnreg.dec to 40 registers): its 128 threads issue every
//    cp.async of the ring: the tile's activation rows (gathered through the slot index, which the
//    producer alone keeps in shared memory, double-buffered by unit) and the raw Q4_K bytes of the
//    unit's 128 weight rows (16-byte head + 32 quant bytes a row a stage: 3 copies a thread).
//  - Warpgroups 1 and 2, the consumers (setmaxnreg.inc to 232): consumer warp w = warp − 4 is
//    kWgmma's warp w (A rows 16w .. 16w + 15 of the unit, m64 half w / 4): the same
//    dequantization (expert_prefill_wgexp_a.cuh, the same operations as kWgmma's), the same
//    WgmmaRegA<N> calls in the same k order into accumulators of the same layout, the same
//    epilogue arithmetic; so the outputs are kWgmma's bit for bit.
// Ring: kWgmma's slot layout (activations N x 128 bytes swizzled at the slot base, then the raw
// bytes), 5 slots at kMaxN's size, each with a "full" mbarrier (count 128: every producer thread
// arrives through cp.async.mbarrier.arrive.noinc once its copies of the stage have landed) and an
// "empty" one (count 8: lane 0 of each consumer warp, once wgmma.wait_group shows its
// warpgroup's wgmmas of the stage are done). The stage counter runs across units (stage f of the
// block's i-th unit is ring stage i·K/64 + f; slot = stage % 5, phase = stage / 5), so the
// producer runs ahead into the next unit's stages while the consumers finish the epilogue: no
// per-unit pipeline fill, no barrier re-initialization, no block-wide barrier after the start.
// The depth is fixed (not h/wgpipe's Stages(N)): a flowing ring needs one slot size for every N.
// Epilogues: gate/up staged (SiLU(gate)·up rounded to f16, rows of 64 f16, 16-byte chunks
// swizzled by row, no pad) in a region of its own beside the ring, between two consumer-only named
// barriers (the first: the previous unit's staging has been read by every consumer); down stored
// straight from the accumulators. (The layout of the retired kWgmmaOverlap; kWgmma stages both
// in the ring, which here is still being filled with the next unit's stages.)
// Shared memory: ring 5 x 38 KB + staging 32 KB + index 2 KB + barriers: 224 KB.
#include "gpu_service/backends/cuda/moe/expert_prefill_wgws.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/mbarrier.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_stream.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_wgexp.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_wgexp_a.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/wgmma_f16.cuh"

namespace tandem::cuda {
namespace prefill_wgws {
namespace {

constexpr int kThreads = 384;
constexpr int kProducerThreads = 128;
constexpr int kConsumerThreads = 256;
constexpr int kConsumerWarps = kConsumerThreads / 32;
// setmaxnreg: 128 · 40 + 256 · 232 = 64512 <= 65536. ptxas allocates each region to its count
// (sm_90a SASS: the producer uses R0-R37, the consumers up to R204; no spills).
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
// The ring and its geometry: wgexp_a (expert_prefill_wgexp_a.cuh).
using wgexp_a::kBBytes, wgexp_a::kMaxN, wgexp_a::kQ4KBlockBytes, wgexp_a::kRawBytes, wgexp_a::kRawRowBytes;
using wgexp_a::kRingBytes, wgexp_a::kStageBytes, wgexp_a::kStageK, wgexp_a::kStages, wgexp_a::kUnitRows;
constexpr int kStagingOffset = kRingBytes;  // gate/up: [kMaxN][64] f16, swizzled
constexpr int kStagingBytes = kMaxN * 128;
constexpr int kIndexOffset = kStagingOffset + kStagingBytes;  // int32 [2][kMaxN]: the a row of each tile row
constexpr int kBarOffset = kIndexOffset + 2 * kMaxN * 4;      // uint64 full[kStages], empty[kStages]
constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + slack for the 1024-byte alignment
// Named barriers (0 is __syncthreads).
constexpr int kConsumerBar = 1;
constexpr int kProducerBar = 2;
static_assert(kStageBytes % 1024 == 0 && kStagingOffset % 1024 == 0, "aligned swizzle atoms");
static_assert(kProducerThreads == kUnitRows, "a producer thread a weight row");
static_assert(kBarOffset % 8 == 0, "aligned mbarriers");
static_assert(kSmemBytes <= 227 * 1024, "one block an SM");
static_assert(kConsumerWarps * 16 == kUnitRows, "eight consumer warps of 16 weight rows");
static_assert(kProducerThreads * kProducerRegs + kConsumerThreads * kConsumerRegs <= 65536, "register file");

using Args = wgexp_a::KernelArgs;

__device__ __forceinline__ uint32_t FullBar(uint32_t bars, uint32_t slot) { return bars + 8u * slot; }
__device__ __forceinline__ uint32_t EmptyBar(uint32_t bars, uint32_t slot) { return bars + 8u * (kStages + slot); }

// Blocks until `count` threads (a multiple of 32, whole warps) have reached named barrier `id`.
__device__ __forceinline__ void NamedBarrierSync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ int32_t LoadShared(uint32_t addr) {
  int32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// setmaxnreg (sm_90a only; the compute_90 PTX traps at its first wgmma anyway). Warpgroup-uniform.
template <int kRegs>
__device__ __forceinline__ void DecreaseRegisters() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void IncreaseRegisters() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// The producer warpgroup (ptid 0 .. 127): every copy of every unit of this block, stage after
// stage, each into slot stage % kStages once the consumers have released that slot's previous fill.
template <bool kGateUp>
__device__ __forceinline__ void Produce(const Args& p, int units, int col_blocks, int32_t* s_rows, uint32_t smem_base,
                                        uint32_t bars) {
  const int ptid = static_cast<int>(threadIdx.x);
  const int K = p.K, ksteps = K / kStageK;
  const int64_t row_bytes = static_cast<int64_t>(K / 256) * kQ4KBlockBytes;
  const int chunk = ptid & 7;
  uint32_t stage = 0;
  int buf = 0;
#pragma unroll 1
  for (int u = static_cast<int>(blockIdx.x); u < units; u += static_cast<int>(gridDim.x), buf ^= 1) {
    const PrefillTile tile = p.tiles[u / col_blocks];
    const int col = u % col_blocks;
    const int rows = min(tile.rows, kMaxN);
    // Buffer buf was last read for unit u − 2 by copies every producer thread issued before the
    // named barrier of unit u − 1.
    for (int r = ptid; r < rows; r += kProducerThreads) {
      const int slot = tile.first_slot + r;
      s_rows[buf * kMaxN + r] = p.a_index != nullptr ? p.a_index[slot] : slot;
    }
    // Read back through a 32-bit shared address in the stage loop (a generic pointer costs two
    // of the producer's 40 registers).
    const uint32_t rows_of = SmemAddr(s_rows + buf * kMaxN);
    NamedBarrierSync(kProducerBar, kProducerThreads);
    // Raw weights: producer thread r copies unit row r (the consumer warp r / 16's A row r % 16;
    // gate/up: the gate (r % 16 < 8) or up row of feature 8 (r / 16) + r % 8): its 16-byte head and
    // the 32 quant bytes of the stage. One row pointer a thread keeps the producer in 40 registers
    // (kWgmma's mapping, task = (row task / 3, piece task % 3), needed three); the destination
    // stride of 48 bytes keeps each group of 8 threads' 16-byte stores on distinct banks.
    const uint8_t* raw_row;
    if constexpr (kGateUp) {
      const int feature = col * (kUnitRows / 2) + (ptid >> 4) * 8 + (ptid & 7);
      raw_row = static_cast<const uint8_t*>((ptid & 8) != 0 ? tile.up : tile.gate) + feature * row_bytes;
    } else {
      raw_row = static_cast<const uint8_t*>(tile.down) + static_cast<int64_t>(col * kUnitRows + ptid) * row_bytes;
    }
#pragma unroll 1
    for (int f = 0; f < ksteps; ++f, ++stage) {
      const uint32_t slot = stage % kStages, fill = stage / kStages;
      if (fill > 0) mbarrier::WaitParity(EmptyBar(bars, slot), (fill - 1) & 1);
      const uint32_t sb = smem_base + slot * kStageBytes;
      const int64_t k0 = static_cast<int64_t>(f) * kStageK + chunk * 8;
      for (int r = ptid >> 3; r < rows; r += kProducerThreads / 8) {
        CpAsync16(sb + wgmma::SwizzledOffset(r, chunk), p.a + static_cast<int64_t>(LoadShared(rows_of + 4 * r)) * K + k0);
      }
      const uint8_t* block = raw_row + (f >> 2) * kQ4KBlockBytes;
      const uint32_t raw_dst = sb + kBBytes + ptid * kRawRowBytes;
      CpAsync16(raw_dst, block);                       // d, dmin, scales
      CpAsync16(raw_dst + 16, block + 16 + 32 * (f & 3));  // quant chunk f % 4
      CpAsync16(raw_dst + 32, block + 32 + 32 * (f & 3));
      mbarrier::ArriveOnCpAsync(FullBar(bars, slot));
    }
  }
  // No copy of this thread in flight when it exits.
  CpAsyncCommit();
  CpAsyncWait<0>();
}

// One unit (tile x 128 weight rows, all of K) at wgmma N = kN (kN >= tile rows), by the consumer
// warpgroups; its stages are ring stages stage0 .. stage0 + K / 64 − 1.
template <bool kGateUp, int kN>
__device__ __forceinline__ void ConsumeUnit(const Args& p, int64_t first_slot, int rows, int col, uint8_t* smem,
                                            uint32_t smem_base, uint32_t stage0, uint32_t bars) {
  static_assert(kN % 32 == 0 && kN <= kMaxN, "N in steps of 32");
  const int ctid = static_cast<int>(threadIdx.x) - kProducerThreads;
  const int lane = ctid & 31, warp = ctid >> 5, g = lane >> 2, q = lane & 3;
  const int ksteps = p.K / kStageK;  // a multiple of 4 (K % 256 == 0): the loop takes two at a time
  const uint32_t sel = wgexp_a::LaneSelector(q);

  // Stage f's A fragments of this warp, once every producer thread's copies of it have landed.
  auto dequant = [&](int f, uint32_t(&dst)[4][4]) {
    const uint32_t stage = stage0 + static_cast<uint32_t>(f);
    const uint32_t slot = stage % kStages;
    mbarrier::WaitParity(FullBar(bars, slot), (stage / kStages) & 1);
    __syncwarp();              // the warp converged again for the .aligned wgmma instructions
    wgmma::FenceProxyAsync();  // the landed activations, for the async proxy of the wgmmas
    wgexp_a::DequantStage(smem + slot * kStageBytes + kBBytes + (warp * 16 + g) * kRawRowBytes, f & 3, sel, dst);
  };
  // This warp is done with stage f's slot (its dequantization read it, its warpgroup's wgmmas of
  // it are done): one arrival on the slot's empty barrier.
  auto release = [&](int f) {
    __syncwarp();
    if (lane == 0) mbarrier::Arrive(EmptyBar(bars, (stage0 + static_cast<uint32_t>(f)) % kStages));
    __syncwarp();  // converged again for the next .aligned wgmma instruction
  };

  // Accumulators (CLayout_64xN), as kWgmma's.
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
  auto mma = [&](int f, const uint32_t(&src)[4][4]) {
    wgexp_a::StageMma<kN>(acc, src, smem_base + ((stage0 + static_cast<uint32_t>(f)) % kStages) * kStageBytes, f == 0);
  };
  // Stage f: its wgmmas (A set cur) go out; once stage f − 1's are done in this warpgroup (A set
  // `next` free, slot of f − 1 released), stage f + 1 is dequantized into `next` while the tensor
  // cores work on stage f.
  auto step = [&](int f, const uint32_t(&cur)[4][4], uint32_t(&next)[4][4]) {
    mma(f, cur);
    wgmma::Wait<1>();
    wgmma::FenceOperands(acc);
    if (f >= 1) release(f - 1);
    if (f + 1 < ksteps) dequant(f + 1, next);
  };

  uint32_t a0[4][4], a1[4][4];
  dequant(0, a0);
#pragma unroll 1
  for (int f = 0; f < ksteps; f += 2) {
    step(f, a0, a1);
    step(f + 1, a1, a0);
  }
  wgmma::Wait<0>();
  wgmma::FenceOperands(acc);
  release(ksteps - 1);

  if constexpr (kGateUp) {
    // Rows of 64 f16 (128 bytes), 16-byte chunk c of row t at chunk c ^ (t % 8): a warp's stores
    // (chunk w, tokens 2q + e apart) spread over all banks without a pad.
    uint16_t* st = reinterpret_cast<uint16_t*>(smem + kStagingOffset);
    NamedBarrierSync(kConsumerBar, kConsumerThreads);  // every consumer has read the previous unit's staging
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 8 * j + 2 * q + e;
        st[t * 64 + ((warp ^ (t & 7)) << 3) + g] =
            __half_as_ushort(__float2half_rn(prefill_stream::SiluTimes(acc[4 * j + e], acc[4 * j + 2 + e])));
      }
    }
    NamedBarrierSync(kConsumerBar, kConsumerThreads);
    for (int task = ctid; task < rows * 8; task += kConsumerThreads) {
      const int t = task >> 3, chunk = task & 7;
      *reinterpret_cast<uint4*>(p.act_out + (first_slot + t) * p.out_cols + col * (kUnitRows / 2) + chunk * 8) =
          *reinterpret_cast<const uint4*>(st + t * 64 + ((chunk ^ (t & 7)) << 3));
    }
  } else {
    // Down from the accumulators: a warp's store covers 8 consecutive features (32 bytes) of 4 tokens.
    float* out = p.f32_out + col * kUnitRows + 16 * warp + g;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 8 * j + 2 * q + e;
        if (t < rows) {
          float* o = out + (first_slot + t) * p.out_cols;
          o[0] = acc[4 * j + e];
          o[8] = acc[4 * j + 2 + e];
        }
      }
    }
  }
}

// Weight rows n < N (gate/up: N = 2·inner, unit c = features 64c .. 64c + 63; down: N = h),
// K % 256 == 0, tiles of at most 256 rows; kWgmma's persistent tile-major walk of the units.
template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1) WgmmaWsQ4KGemmKernel(Args p) {
  // pdl.cuh: the tiles, their count, the activations and the slot index are the step's.
  PdlWaitForPrevious();
  PdlAllowNext();
  int num_tiles = p.num_tiles;
  if (p.tile_count != nullptr) num_tiles = min(num_tiles, *p.tile_count);
  extern __shared__ uint8_t smem_raw[];
  // The swizzled activation tiles need 1024-byte alignment.
  uint8_t* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  const uint32_t smem_base = SmemAddr(smem);
  const uint32_t bars = smem_base + kBarOffset;
  const int col_blocks = p.N / kUnitRows;
  const int units = num_tiles * col_blocks;  // < 2^31: LaunchWgmmaWsQ4KGemm checks the bound
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbarrier::Init(FullBar(bars, s), kProducerThreads);
      mbarrier::Init(EmptyBar(bars, s), kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();  // the only block-wide barrier: the mbarriers initialized
  // Warpgroup index, made warp-uniform for the compiler (setmaxnreg is .sync.aligned).
  const int wg = __shfl_sync(0xFFFFFFFFu, static_cast<int>(threadIdx.x) / 128, 0);
  if (wg == 0) {
    DecreaseRegisters<kProducerRegs>();
    Produce<kGateUp>(p, units, col_blocks, reinterpret_cast<int32_t*>(smem + kIndexOffset), smem_base, bars);
    return;
  }
  IncreaseRegisters<kConsumerRegs>();
  const uint32_t ksteps = static_cast<uint32_t>(p.K / kStageK);
  uint32_t stage0 = 0;
#pragma unroll 1
  for (int u = static_cast<int>(blockIdx.x); u < units; u += static_cast<int>(gridDim.x), stage0 += ksteps) {
    const PrefillTile& tile = p.tiles[u / col_blocks];
    const int64_t first_slot = tile.first_slot;
    const int rows = min(tile.rows, kMaxN);
    const int col = static_cast<int>(u % col_blocks);
    switch ((rows + 31) >> 5) {  // block-uniform: wgmma N = rows rounded up to 32
      case 1: ConsumeUnit<kGateUp, 32>(p, first_slot, rows, col, smem, smem_base, stage0, bars); break;
      case 2: ConsumeUnit<kGateUp, 64>(p, first_slot, rows, col, smem, smem_base, stage0, bars); break;
      case 3: ConsumeUnit<kGateUp, 96>(p, first_slot, rows, col, smem, smem_base, stage0, bars); break;
      case 4: ConsumeUnit<kGateUp, 128>(p, first_slot, rows, col, smem, smem_base, stage0, bars); break;
      case 5: ConsumeUnit<kGateUp, 160>(p, first_slot, rows, col, smem, smem_base, stage0, bars); break;
      case 6: ConsumeUnit<kGateUp, 192>(p, first_slot, rows, col, smem, smem_base, stage0, bars); break;
      case 7: ConsumeUnit<kGateUp, 224>(p, first_slot, rows, col, smem, smem_base, stage0, bars); break;
      default: ConsumeUnit<kGateUp, 256>(p, first_slot, rows, col, smem, smem_base, stage0, bars); break;
    }
  }
}

template <bool kGateUp>
cudaError_t Launch(const Args& args, cudaStream_t stream) {
  return wgexp_a::LaunchPersistentWgmma(WgmmaWsQ4KGemmKernel<kGateUp>, args, kThreads, kSmemBytes, stream);
}

}  // namespace
}  // namespace prefill_wgws

cudaError_t LaunchWgmmaWsQ4KGemm(bool gate_up, int tile_rows, const PrefillTile* tiles, int num_tiles,
                                 const uint16_t* a, const int32_t* a_index, int K, int N, int out_cols,
                                 uint16_t* act_out, float* f32_out, cudaStream_t stream, const int* tile_count) {
  if (K <= 0 || K % 256 != 0 || N <= 0 || N % kWgmmaUnitRows != 0 || tile_rows < 1 || tile_rows > kWgmmaMaxTileRows) {
    return cudaErrorInvalidValue;
  }
  if (num_tiles <= 0) return cudaSuccess;
  if (static_cast<int64_t>(num_tiles) * (N / kWgmmaUnitRows) > INT32_MAX) return cudaErrorInvalidValue;  // int unit index
  const prefill_wgws::Args args{tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, tile_count};
  return gate_up ? prefill_wgws::Launch<true>(args, stream) : prefill_wgws::Launch<false>(args, stream);
}

}  // namespace tandem::cuda
