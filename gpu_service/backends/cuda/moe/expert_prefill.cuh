// Device side of the prefill expert path (expert_prefill.h drives it).
//
// The grouped path (the default): every expert of a call in a few launches. Activations are
// rounded to f16 once; then one launch per tile height computes SiLU(x·Wg^T)·(x·Wu^T) for every
// (tile, feature block) and one computes act·Wd^T, each with f16 tensor-core MMAs and f32
// accumulation. The quantized weights are dequantized to f16 in shared memory tile by tile (no f16
// copy of the weights in global memory), so a layer's routed weights are read about once per row
// tile. Two kernels (PrefillKernel): the streamed Q4_K one (expert_prefill_stream.cuh) and the
// software-pipelined tile kernel for every type (expert_prefill_gemm.cuh).
//
// The per-expert cuBLAS path (kept as a second algorithm for comparison): element-wise kernels
// around cuBLAS (weights to f16, rows gathered as f16, SiLU(gate)·up to f16).
//
// f16 values are passed as their uint16_t bit patterns so that g++ can include this header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// One row tile of the grouped launches: `rows` consecutive slots of one expert, starting at
// first_slot. gate and up are {h, I} matrices, down {I, h}, in the layer's block formats.
struct PrefillTile {
  const void* gate;
  const void* up;
  const void* down;
  int32_t first_slot;
  int32_t rows;  // 1 .. the launch's tile_rows
};
static_assert(sizeof(PrefillTile) == 32, "PrefillTile is uploaded as raw bytes");

// Row-tile heights the grouped launches are compiled for (tile_rows must be one of them).
inline constexpr int kPrefillTileRows[] = {16, 32, 64, 128};

// The kernel of the grouped launches.
//  - kPipelined (expert_prefill_gemm.cuh), every type: one block per (tile, 128 B rows), the
//    weights dequantized to an f16 tile in shared memory; each k-step's MMAs overlap the weight
//    loads of later steps and the activation copy of the next. tile_rows: one of kPrefillTileRows.
//  - kStreamed (expert_prefill_stream.cuh), Q4_K only: a persistent grid streaming the raw Q4_K
//    bytes through a cp.async ring and dequantizing them straight into the MMA fragments; one
//    launch takes tiles of any height up to kStreamedMaxTileRows (tile_rows is that bound, 1 ..
//    kStreamedMaxTileRows). Needs K a multiple of 256 and N (gate/up: 2·inner, down: h) a
//    multiple of kStreamedUnitCols.
//  - kStreamedL2Lines256, kStreamedUnitPrefetch: kStreamed with a wider DRAM access pattern for the
//    weights (L2 fetches 256-byte lines; or each unit's B rows prefetched whole into L2), an
//    experiment on why kStreamed reads weights at about 1 TB/s (expert_prefill_stream.cuh).
//  - kStreamedRows (expert_prefill_rows.cuh), Q4_K only: a persistent grid whose every stage is a
//    few whole weight rows over all of K (contiguous runs of 9-18 KB), the tile's activations in
//    registers, the block's warps splitting K. tile_rows: the bound on a tile's rows, 1 ..
//    kStreamedRowsMaxTileRows (<= 16 and <= 32 run two instantiations). Needs K a multiple of 256
//    and at most kStreamedRowsMaxK, and N a multiple of 128.
//  - kStreamedAuto (the runner's default, not a launch argument): kStreamedRows where it fits and
//    nearly every group fits one 16-row tile (ChooseStreamedRowsTile), else kStreamed.
//  - kMmq (expert_prefill_mmq.cu), Q4_K only: integer tensor cores (mma.m16n8k32.s8) on the raw
//    quants, activations quantized to two int8 terms; per-warp cp.async rings of whole super-blocks
//    of 16 weight rows (expert_prefill_mmq.cuh). tile_rows 1 .. kMmqMaxTileRows. kMmqWarps16 /
//    kMmqWarps4: 16 warps a block with rings of 4, or 4 warps with rings of 16 (tiles <= 16); kMmqLoadOnly /
//    kMmqMathOnly: timing experiments (only the weight loads; only the math on whatever the ring
//    holds), results meaningless; kMmqHiOnly: activations as one int8 term (the lo term dropped:
//    less precise, to time what the second term costs); kMmqF32Min: the min term as f32 FMAs per
//    sub-block instead of tf32 MMAs per super-block; kMmqL2Prefetch: kMmq with each warp's rows of
//    its next unit prefetched into L2 as whole contiguous runs; kMmqLean (expert_prefill_mmq_lean.cu):
//    kMmqWarps16's shape (16 warps, rings of 4, tiles <= 16) with fewer instructions per MMA;
//    kMmqLeanWarps8: the same with 8 warps and rings of 8; kMmqLean2 (expert_prefill_mmq_lean2.cu):
//    kMmqLean with the tile descriptor read a unit ahead and the tile's rows staged by cp.async
//    (double-buffered where two fit beside the ring), bit-identical outputs, the default for
//    small groups (MmqAutoKernel).
//  - kWgmma (expert_prefill_wgexp.cu), Q4_K only: warpgroup MMAs (sm_90a) with the weights
//    dequantized from a raw-Q4_K cp.async ring straight into the register A operand and the tile's
//    tokens as N (up to 256); tiles of up to kWgmmaMaxTileRows (tile_rows is that bound, 1 .. 256),
//    units of 128 weight rows. Needs K a multiple of 256 and N a multiple of 128. Reads a device
//    tile count. kStreamedAuto's choice for large groups with TANDEM_PREFILL_WGMMA=1 (the default
//    until 2026-12-02; ChooseWgmmaTile, WgmmaAutoKernel). kWgmmaWs (expert_prefill_wgws.cu):
//    kWgmma warp-specialized: a producer warpgroup issues every copy into an mbarrier-paced ring
//    that flows across units, two consumer warpgroups only dequantize, MMA and store; bit-identical
//    outputs, kStreamedAuto's choice for large groups by default (TANDEM_PREFILL_WGMMA=0 turns the
//    wgmma kernels off). (kWgmmaOverlap, kWgmma with the next unit's first stages issued under a
//    unit's epilogue, measured even with kWgmma and was removed on 2026-12-02.)
enum class PrefillKernel {
  kPipelined,
  kStreamed,
  kStreamedL2Lines256,
  kStreamedUnitPrefetch,
  kStreamedRows,
  kStreamedAuto,
  kMmq,
  kMmqWarps16,
  kMmqLoadOnly,
  kMmqMathOnly,
  kMmqWarps4,
  kMmqHiOnly,
  kMmqF32Min,
  kMmqL2Prefetch,
  kMmqLean,
  kMmqLeanWarps8,
  kMmqLean2,
  kWgmma,
  kWgmmaWs,
};

inline constexpr bool IsWgmmaKernel(PrefillKernel k) {
  return k == PrefillKernel::kWgmma || k == PrefillKernel::kWgmmaWs;
}

inline constexpr bool IsMmqKernel(PrefillKernel k) {
  return k == PrefillKernel::kMmq || k == PrefillKernel::kMmqWarps16 || k == PrefillKernel::kMmqLoadOnly ||
         k == PrefillKernel::kMmqMathOnly || k == PrefillKernel::kMmqWarps4 || k == PrefillKernel::kMmqHiOnly ||
         k == PrefillKernel::kMmqF32Min || k == PrefillKernel::kMmqL2Prefetch || k == PrefillKernel::kMmqLean ||
         k == PrefillKernel::kMmqLeanWarps8 || k == PrefillKernel::kMmqLean2;
}

// Bounds of kStreamedRows: a tile's rows, and K (one Q4_K super-block per warp of 8).
inline constexpr int kStreamedRowsMaxTileRows = 32;
inline constexpr int kStreamedRowsMaxK = 2048;

// Bound on a kStreamed tile's rows (four m16 MMA fragments), and the B rows of one of its units.
inline constexpr int kStreamedMaxTileRows = 64;
inline constexpr int kStreamedUnitCols = 128;

// How the persistent blocks of the kStreamed variants take their units (expert_prefill_stream.cuh,
// StreamedWorkOrder; every order gives bit-identical outputs):
//  - kRanges: block b walks a contiguous range of units (the order until 2026-12-01; at 8192 tokens
//    each expert's weights come from HBM once per row tile, about 3 times);
//  - kStrided: block b walks units b, b + grid, b + 2·grid, ...;
//  - kDynamic: blocks take the next unit from a global counter (`counter`: two device ints, 0
//    before the first launch; every launch leaves them 0 again, so launches on one stream may share
//    them, concurrent launches may not). The runner's default (PrefillOptions::work_order).
// Measured (H200, 2026-12-01, expert_prefill_bench --tokens=8192 --only=order, same process, bits
// equal): ranges 3.597 / 3.584, strided 3.602 / 3.590, dynamic 3.444 / 3.436 ms a layer
// (moe/PERF_NOTES.md "work order").
enum class StreamedOrder { kRanges, kStrided, kDynamic };
struct StreamedSchedule {
  StreamedOrder order = StreamedOrder::kRanges;
  int* counter = nullptr;  // device, 2 ints; needed by kDynamic
};

// Output features (down) or interleaved gate/up rows (gate/up) one block of a grouped launch computes.
inline constexpr int kPrefillTileCols = 128;

// out[i] = x[i] rounded to f16 (nearest even), for i < count.
cudaError_t LaunchConvertToF16(const float* x, int64_t count, uint16_t* out, cudaStream_t stream);

// For every tile and every row r < tile.rows, slot s = tile.first_slot + r:
//   act[s] (inner f16) = SiLU(xb[index[s]]·gate^T) ⊙ (xb[index[s]]·up^T), rounded to f16,
// where xb holds f16 rows of h elements. Every tile must have rows <= tile_rows. h must be a
// positive multiple of 32 (and of the type's block); cudaErrorInvalidValue otherwise, for an
// unsupported type or tile_rows, or a shape kStreamed refuses (see PrefillKernel).
// tile_count (device, may be null): the number of tiles, read by the kernel (a plan made on the
// device); num_tiles is then its bound and sizes the grid. The kStreamed and wgmma kernels only
// (cudaErrorInvalidValue for the others). schedule: the kStreamed variants' work order (ignored by
// the other kernels); cudaErrorInvalidValue for kDynamic without a counter.
cudaError_t LaunchPrefillGateUp(PrefillKernel kernel, uint32_t type, int tile_rows, const PrefillTile* tiles, int num_tiles,
                                const uint16_t* xb, const int32_t* index, int h, int inner, uint16_t* act,
                                cudaStream_t stream, const int* tile_count = nullptr, StreamedSchedule schedule = {});

// For every tile and row as above: partial[s] (h f32) = act[s]·down^T. inner must be a positive
// multiple of 32 (and of the type's block).
cudaError_t LaunchPrefillDown(PrefillKernel kernel, uint32_t type, int tile_rows, const PrefillTile* tiles, int num_tiles,
                              const uint16_t* act, int h, int inner, float* partial, cudaStream_t stream,
                              const int* tile_count = nullptr, StreamedSchedule schedule = {});

// out (rows × cols f16, row-major) = the matrix w {cols, rows} of ggml type `type`, dequantized
// and rounded to nearest even. cudaErrorInvalidValue for an unsupported type, cols not a multiple
// of the block, or a misaligned w.
cudaError_t LaunchDequantizeToF16(uint32_t type, const void* w, int cols, int rows, uint16_t* out,
                                   cudaStream_t stream);

// out row i (cols f16) = x row index[i] (f32), for i < m.
cudaError_t LaunchGatherRowsF16(const float* x, int cols, const int32_t* index, int m, uint16_t* out,
                                 cudaStream_t stream);

// act (m × inner f16) = SiLU(gu[:, 0:inner]) ⊙ gu[:, inner:2·inner] for gu m × 2·inner f32.
cudaError_t LaunchSiluMulToF16(const float* gu, int m, int inner, uint16_t* act, cudaStream_t stream);
// act = SiLU(gate) ⊙ up over count f32 elements (the shared expert between its dense products).
cudaError_t LaunchSiluMulF32(const float* gate, const float* up, int64_t count, float* act, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_CUH_
