// The weights-as-A wgmma Q4_K prefill GEMM (PrefillKernel::kWgmma): warpgroup MMAs whose A operand
// is the dequantized weights, straight from registers, and whose B operand is the tile's tokens.
// Since 2026-12-02 its warp-specialized form kWgmmaWs (expert_prefill_wgws.cu: the same arithmetic,
// the same bits, 1.80 against 1.96-2.13 ms a layer at 8192 tokens) is the default; this kernel is
// the reference the tests compare kWgmmaWs with and the TANDEM_PREFILL_WGMMA=1 fallback.
//
// Why: at 8192 tokens (~160 rows an expert) the streamed kernel (expert_prefill_stream.cuh,
// mma.sync, tiles of <= 64 tokens x 128 weight rows) runs the routed experts at ~170 TFLOP/s. The
// first wgmma kernel (branch h/xlarge, expert_prefill_wide.cu) put the tokens in M and dequantized
// every weight stage into a swizzled f16 tile in shared memory (B): 3.0 ms a layer, bound by the
// dequantize + st.shared + two barriers a stage, not by the tensor cores. Here the roles are
// swapped: each consumer warp dequantizes its own 16 weight rows from the raw Q4_K bytes in the
// cp.async ring straight into its wgmma A fragment (no f16 weight tile, no st.shared, no barrier
// between the dequantization and the MMA), and the tokens (up to 256 rows, one tile an expert at
// 8192 tokens) are wgmma's N, read from shared memory by descriptor.
//
// Geometry: 256 threads = 2 warpgroups, one block an SM (__launch_bounds__(256, 1)). A unit is one
// tile x 128 weight rows (warp w: rows 16w .. 16w + 15; warpgroup v: m64 rows 64v ..); the
// persistent grid walks the units tile-major with stride gridDim.x (unit = tile · col_blocks +
// col), so the blocks at any moment run consecutive units: an expert's units together, its
// activation rows and weights shared in L2. Per unit the wgmma N is the tile's rows rounded up to
// 32 (WgmmaRegA<N>, eight instantiations), so a 160-row tile pays 160, not 256.
//  - gate/up: unit c is features 64c .. 64c + 63; warp w's A rows 0-7 are the gate rows of features
//    64c + 8w .. + 7, rows 8-15 their up rows, so thread (g, q) holds gate (accumulator row g) and
//    up (row g + 8) of the same feature for the same tokens: SiLU(gate)·up in registers, rounded
//    to f16, staged through shared memory as [token][64 features] for 128-byte stores.
//  - down: unit c is output features 128c .. 128c + 127 (K = inner); the f32 partial rows are
//    staged as [token][128] the same way.
// Ring: a stage is 64 deep (one 32-byte quant chunk of a Q4_K super-block: sub-blocks 2c, 2c + 1):
// the tile's activations (N rows x 128 bytes, K-major, 128-byte swizzle, exactly h/xlarge's layout
// and descriptor; gathered rows through the slot index for gate/up) and the raw bytes of the 128
// weight rows (16-byte head re-copied every stage, 32 quant bytes). 5 stages. The A registers are
// double-buffered: stage f's four k16 wgmmas are one commit group; while they run, each warp
// dequantizes stage f + 1 into the other register set (the set stage f − 1 read: wait_group 1
// first), with one barrier a stage for slot reuse. The ring does not flow across units (each unit
// pays its prologue; with 5 stages and 8 (down) or 32 (gate/up) stages a unit): kWgmmaWs's does.
//
// Values: exactly the streamed kernel's f16 weights (a weight is f16(d·sc)·q + f16(−dmin·m) in one
// f16 FMA, q exact from the nibble; expert_prefill_stream.cuh "Values"), f16 activations, f32
// accumulation: results differ from the other f16 kernels only in the f32 summation order.
#include "gpu_service/backends/cuda/moe/expert_prefill_wgexp.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_stream.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_wgexp_a.cuh"
#include "gpu_service/backends/cuda/wgmma_f16.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace prefill_wgexp {
namespace {

constexpr int kThreads = 256;
// The ring and its geometry: wgexp_a (expert_prefill_wgexp_a.cuh).
using wgexp_a::kBBytes, wgexp_a::kMaxN, wgexp_a::kQ4KBlockBytes, wgexp_a::kRawBytes, wgexp_a::kRawRowBytes;
using wgexp_a::kRingBytes, wgexp_a::kStageBytes, wgexp_a::kStageK, wgexp_a::kStages, wgexp_a::kUnitRows;
// int32 [2][kMaxN]: the a row of each tile row, for this unit and the next.
constexpr int kIndexOffset = kRingBytes;
constexpr int kSmemBytes = kIndexOffset + 2 * kMaxN * 4 + 1024;  // + slack for the 1024-byte alignment
constexpr int kRawTasks = kUnitRows * 3;                // head + two 16-byte quant pieces a row
constexpr int kRawLoads = (kRawTasks + kThreads - 1) / kThreads;
// Epilogue staging (aliases the ring once the unit's MMAs and copies are done): gate/up
// [token][kActStride] f16, down [token][kDownStride] f32; the pads spread a warp's accumulator
// stores (tokens 2q apart, features g) over all 32 banks.
constexpr int kActStride = 72;
constexpr int kDownStride = 132;
static_assert(kMaxN * kDownStride * 4 <= kRingBytes && kMaxN * kActStride * 2 <= kRingBytes, "staging fits the ring");
static_assert(kSmemBytes <= 227 * 1024, "one block an SM");
static_assert(kThreads / 32 * 16 == kUnitRows, "eight warps of 16 weight rows");

using Args = wgexp_a::KernelArgs;

// The copies of k-stage f (< K / 64) of a unit (tile, rows <= kBLoads · 32, col) into ring slot
// f % kStages, committed as one cp.async group (an empty group for f >= K / 64, so that the wait
// counts stay uniform). s_rows: the a row of each tile row.
template <bool kGateUp, int kBLoads>
__device__ __forceinline__ void IssueStage(const Args& p, const PrefillTile& tile, int rows, int col, int f,
                                           const int32_t* s_rows, uint32_t smem_base) {
  const int tid = static_cast<int>(threadIdx.x);
  const int K = p.K;
  if (f < K / kStageK) {
    const uint32_t sb = smem_base + static_cast<uint32_t>((f % kStages) * kStageBytes);
    const int k0 = f * kStageK;
    // Activations: 16-byte chunk tid % 8 of tile rows tid / 8 + 32 i.
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const int r = (tid >> 3) + 32 * i;
      if (r < rows) {
        CpAsync16(sb + wgmma::SwizzledOffset(r, tid & 7), p.a + static_cast<int64_t>(s_rows[r]) * K + k0 + (tid & 7) * 8);
      }
    }
    // Raw weights: task tid + 256 i = (ring row task / 3, piece task % 3).
    const int64_t row_bytes = static_cast<int64_t>(K / 256) * kQ4KBlockBytes;
    const int64_t block_off = static_cast<int64_t>(f >> 2) * kQ4KBlockBytes;
#pragma unroll
    for (int i = 0; i < kRawLoads; ++i) {
      const int task = tid + i * kThreads;
      if (task < kRawTasks) {
        const int r = task / 3, piece = task % 3;
        const uint8_t* src;
        if constexpr (kGateUp) {
          // Ring row r: warp r / 16's A row r % 16: gate (r % 16 < 8) or up row of feature 8 (r / 16) + r % 8.
          const int feature = col * (kUnitRows / 2) + (r >> 4) * 8 + (r & 7);
          src = static_cast<const uint8_t*>((r & 8) != 0 ? tile.up : tile.gate) + feature * row_bytes;
        } else {
          src = static_cast<const uint8_t*>(tile.down) + static_cast<int64_t>(col * kUnitRows + r) * row_bytes;
        }
        // d, dmin, scales; or half of quant chunk f % 4
        const int off = piece == 0 ? 0 : 16 * piece + 32 * (f & 3);
        CpAsync16(sb + kBBytes + r * kRawRowBytes + 16 * piece, src + block_off + off);
      }
    }
  }
  CpAsyncCommit();
}

// One unit (tile x 128 weight rows, all of K) at wgmma N = kN (kN >= tile rows). s_rows: the a row
// of each tile row (shared memory, written before the call). The unit issues its own prologue and
// its epilogue staging aliases the ring.
template <bool kGateUp, int kN>
__device__ __forceinline__ void RunUnit(const Args& p, const PrefillTile& tile, int rows, int col, uint8_t* smem,
                                        uint32_t smem_base, const int32_t* s_rows) {
  static_assert(kN % 32 == 0 && kN <= kMaxN, "N in steps of 32");
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
  const int K = p.K, ksteps = K / kStageK;  // a multiple of 4 (K % 256 == 0): the loop takes two at a time
  auto issue = [&](int f) { IssueStage<kGateUp, kN / 32>(p, tile, rows, col, f, s_rows, smem_base); };

  // Stage f's A fragments of this warp (rows g and g + 8 of its 16; wgexp_a::DequantStage).
  const uint32_t sel = wgexp_a::LaneSelector(q);
  auto dequant = [&](int f, uint32_t(&dst)[4][4]) {
    wgexp_a::DequantStage(smem + (f % kStages) * kStageBytes + kBBytes + (warp * 16 + g) * kRawRowBytes, f & 3, sel,
                          dst);
  };

  // Accumulators (CLayout_64xN): thread (warp w % 4 of its warpgroup, g, q) holds for n8 block j
  // acc[4j + e] at (A row g, token 8j + 2q + e) and acc[4j + 2 + e] at (A row g + 8, same token).
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
  auto mma = [&](int f, const uint32_t(&src)[4][4]) {
    wgexp_a::StageMma<kN>(acc, src, smem_base + static_cast<uint32_t>((f % kStages) * kStageBytes), f == 0);
  };

  // Stage f: its wgmmas (A set cur) go out; then, once stage f − 1's wgmmas are done in this
  // warpgroup (so A set `next` and ring slot (f − 1) % kStages are free after the barrier) and
  // stage f + 1 has landed, the copies of stage f + kStages − 1 into that slot and the
  // dequantization of stage f + 1 into `next` run while the tensor cores work on stage f.
  auto step = [&](int f, const uint32_t(&cur)[4][4], uint32_t(&next)[4][4]) {
    mma(f, cur);
    wgmma::Wait<1>();
    wgmma::FenceOperands(acc);
    CpAsyncWait<kStages - 3>();
    wgmma::FenceProxyAsync();  // this thread's landed activations, for the async proxy of the wgmmas
    __syncthreads();
    issue(f + kStages - 1);
    if (f + 1 < ksteps) dequant(f + 1, next);
  };

#pragma unroll 1
  for (int f = 0; f < kStages - 1; ++f) issue(f);
  CpAsyncWait<kStages - 2>();
  wgmma::FenceProxyAsync();
  __syncthreads();
  uint32_t a0[4][4], a1[4][4];
  dequant(0, a0);
#pragma unroll 1
  for (int f = 0; f < ksteps; f += 2) {
    step(f, a0, a1);
    step(f + 1, a1, a0);
  }
  wgmma::Wait<0>();
  wgmma::FenceOperands(acc);
  CpAsyncWait<0>();
  __syncthreads();  // every warpgroup's wgmmas done, every copy landed: the ring is free

  const int64_t first_slot = tile.first_slot;
  if constexpr (kGateUp) {
    uint16_t* st = reinterpret_cast<uint16_t*>(smem);
    const int feature = 8 * warp + g;  // of the unit's 64
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 8 * j + 2 * q + e;
        st[t * kActStride + feature] =
            __half_as_ushort(__float2half_rn(prefill_stream::SiluTimes(acc[4 * j + e], acc[4 * j + 2 + e])));
      }
    }
    __syncthreads();
    for (int task = tid; task < rows * 8; task += kThreads) {
      const int t = task >> 3, chunk = task & 7;
      *reinterpret_cast<uint4*>(p.act_out + (first_slot + t) * p.out_cols + col * (kUnitRows / 2) + chunk * 8) =
          *reinterpret_cast<const uint4*>(st + t * kActStride + chunk * 8);
    }
  } else {
    float* st = reinterpret_cast<float*>(smem);
    const int feature = 16 * warp + g;  // of the unit's 128
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 8 * j + 2 * q + e;
        st[t * kDownStride + feature] = acc[4 * j + e];
        st[t * kDownStride + feature + 8] = acc[4 * j + 2 + e];
      }
    }
    __syncthreads();
    // float2: partial is only 8-byte aligned (ExpertPrefillRunner::Run's contract).
    for (int task = tid; task < rows * 64; task += kThreads) {
      const int t = task >> 6, pair = task & 63;
      *reinterpret_cast<float2*>(p.f32_out + (first_slot + t) * p.out_cols + col * kUnitRows + 2 * pair) =
          *reinterpret_cast<const float2*>(st + t * kDownStride + 2 * pair);
    }
  }
  __syncthreads();  // the staging is read before the next unit's copies overwrite the ring
}

// Weight rows n < N (gate/up: N = 2·inner, unit c = features 64c .. 64c + 63; down: N = h),
// K % 256 == 0, tiles of at most 256 rows.
template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1) WgmmaQ4KGemmKernel(Args p) {
  // pdl.cuh: the tiles, their count, the activations and the slot index are the step's.
  PdlWaitForPrevious();
  PdlAllowNext();
  int num_tiles = p.num_tiles;
  if (p.tile_count != nullptr) num_tiles = min(num_tiles, *p.tile_count);
  extern __shared__ uint8_t smem_raw[];
  // The swizzled activation tiles need 1024-byte alignment.
  uint8_t* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  const uint32_t smem_base = SmemAddr(smem);
  int32_t* s_rows = reinterpret_cast<int32_t*>(smem + kIndexOffset);  // [2][kMaxN]
  const int col_blocks = p.N / kUnitRows;
  const int64_t units = static_cast<int64_t>(num_tiles) * col_blocks;
  // Unit `unit`'s tile, rows and column block, and its a rows into s_rows buffer b (a barrier
  // must follow before they are read).
  auto prepare = [&](int64_t unit, int b, PrefillTile& tile, int& rows, int& col) {
    tile = p.tiles[unit / col_blocks];
    col = static_cast<int>(unit % col_blocks);
    rows = min(tile.rows, kMaxN);
    for (int r = static_cast<int>(threadIdx.x); r < rows; r += kThreads) {
      const int slot = tile.first_slot + r;
      s_rows[b * kMaxN + r] = p.a_index != nullptr ? p.a_index[slot] : slot;
    }
  };
  int64_t u = blockIdx.x;
  PrefillTile tile{};
  int rows = 0, col = 0, buf = 0;
  if (u < units) {
    prepare(u, 0, tile, rows, col);
    __syncthreads();
  }
#pragma unroll 1
  while (u < units) {
    const int64_t next = u + gridDim.x;
    PrefillTile next_tile{};
    int next_rows = 0, next_col = 0;
    const int32_t* rows_of = s_rows + buf * kMaxN;
    switch ((rows + 31) >> 5) {  // block-uniform: wgmma N = rows rounded up to 32
      case 1: RunUnit<kGateUp, 32>(p, tile, rows, col, smem, smem_base, rows_of); break;
      case 2: RunUnit<kGateUp, 64>(p, tile, rows, col, smem, smem_base, rows_of); break;
      case 3: RunUnit<kGateUp, 96>(p, tile, rows, col, smem, smem_base, rows_of); break;
      case 4: RunUnit<kGateUp, 128>(p, tile, rows, col, smem, smem_base, rows_of); break;
      case 5: RunUnit<kGateUp, 160>(p, tile, rows, col, smem, smem_base, rows_of); break;
      case 6: RunUnit<kGateUp, 192>(p, tile, rows, col, smem, smem_base, rows_of); break;
      case 7: RunUnit<kGateUp, 224>(p, tile, rows, col, smem, smem_base, rows_of); break;
      default: RunUnit<kGateUp, 256>(p, tile, rows, col, smem, smem_base, rows_of); break;
    }
    if (next < units) {
      prepare(next, buf ^ 1, next_tile, next_rows, next_col);
      __syncthreads();
    }
    u = next;
    tile = next_tile;
    rows = next_rows;
    col = next_col;
    buf ^= 1;
  }
}

template <bool kGateUp>
cudaError_t Launch(const Args& args, cudaStream_t stream) {
  return wgexp_a::LaunchPersistentWgmma(WgmmaQ4KGemmKernel<kGateUp>, args, kThreads, kSmemBytes, stream);
}

}  // namespace
}  // namespace prefill_wgexp

cudaError_t LaunchWgmmaQ4KGemm(bool gate_up, int tile_rows, const PrefillTile* tiles, int num_tiles, const uint16_t* a,
                               const int32_t* a_index, int K, int N, int out_cols, uint16_t* act_out, float* f32_out,
                               cudaStream_t stream, const int* tile_count) {
  if (K <= 0 || K % 256 != 0 || N <= 0 || N % kWgmmaUnitRows != 0 || tile_rows < 1 || tile_rows > kWgmmaMaxTileRows) {
    return cudaErrorInvalidValue;
  }
  if (num_tiles <= 0) return cudaSuccess;
  const prefill_wgexp::Args args{tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, tile_count};
  return gate_up ? prefill_wgexp::Launch<true>(args, stream) : prefill_wgexp::Launch<false>(args, stream);
}

}  // namespace tandem::cuda
