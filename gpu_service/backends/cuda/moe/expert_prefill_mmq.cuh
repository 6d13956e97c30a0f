// The integer-MMA Q4_K prefill kernels (PrefillKernel::kMmq*; expert_prefill_mmq.cu): host-side
// declarations, includable by g++.
//
// Why: the streamed kernels dequantize Q4_K to f16 for f16 MMAs, and that ALU work does not overlap
// the weight loads (expert_prefill_stream.cuh moves weights at ~1.2 TB/s). Here the Q4_K quants are
// the A operand of mma.m16n8k32.s8 as they are: a 32-byte qs chunk of 16 rows read by one ldmatrix
// and masked with 0x0F0F0F0F (low nibbles: sub-block 2p) or shifted by 4 and masked (sub-block
// 2p + 1) gives the int8 A fragments of two sub-blocks; nothing is converted to f16.
//
// Activations (B operand) are quantized once per call (LaunchMmqQuantize), per 256 elements (one
// Q4_K super-block of K): s = max|x| / 127, hi = round(x / s), lo = round((x / s − hi) · 64), so
// x ≈ s · (hi + lo / 64) to within max|x| / 16256, and the float sum of every 32 (sumx). Per weight
// row and token, super-block b with sub-blocks j:
//   Σ_k w_k x_k = d · s · (Σ_j sc_j · dot(q_j, hi_j) + Σ_j sc_j · dot(q_j, lo_j) / 64) − Σ_j dmin · m_j · sumx_j
// where the two integer sums are exact in int32 (|Σ| <= 8 · 63 · 32 · 15 · 127 < 2^25) and are
// converted to float once per super-block.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_MMQ_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_MMQ_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"

namespace tandem::cuda {

// Quantized activation rows of K elements (K a multiple of 256), `rows` rows, as four planes of one
// allocation of MmqActivationBytes(rows, K): hi int8 [rows][K], lo int8 [rows][K], scale f32
// [rows][K / 256] (s above), sumx f32 [rows][K / 32].
struct MmqActivations {
  int8_t* hi;
  int8_t* lo;
  float* scale;
  float* sumx;
};
size_t MmqActivationBytes(int64_t rows, int K);
MmqActivations MmqActivationPlanes(void* base, int64_t rows, int K);

// Bounds: tiles of at most kMmqMaxTileRows slots (16-slot tiles use the ring of 8 stages, up to 32
// the ring of 4), K at most kMmqMaxK (the tile's quantized activations over all of K stay in shared
// memory), K a multiple of 256, N (gate/up: 2·inner; down: h) a multiple of 256.
inline constexpr int kMmqMaxTileRows = 32;
inline constexpr int kMmqMaxK = 2048;

// x f32 [rows][K] (16-byte aligned) -> q (planes of rows × K). cudaErrorInvalidValue for K not a
// multiple of 256 or a misaligned x.
cudaError_t LaunchMmqQuantize(const float* x, int64_t rows, int K, MmqActivations q, cudaStream_t stream);

// kernel: kMmq, kMmqWarps16, kMmqLean, kMmqLoadOnly or kMmqMathOnly (the last two compute nothing useful:
// timing experiments). For every tile and row r < tile.rows, slot s = tile.first_slot + r:
//   act[s] (inner f32) = SiLU(x[index[s]]·gate^T) ⊙ (x[index[s]]·up^T), x quantized (h wide rows).
// tile_count (device, may be null): the number of tiles, read by the kernel (a plan made on the
// device); num_tiles is then its bound and sizes the grid. kMmqLean and kMmqLeanWarps8 only
// or kMmqLean2
// (cudaErrorInvalidValue for the others).
cudaError_t LaunchMmqGateUp(PrefillKernel kernel, int tile_rows, const PrefillTile* tiles, int num_tiles,
                            MmqActivations x, const int32_t* index, int h, int inner, float* act, cudaStream_t stream,
                            const int* tile_count = nullptr);

// partial[s] (h f32) = act[s]·down^T, act quantized (inner wide rows, indexed by slot).
cudaError_t LaunchMmqDown(PrefillKernel kernel, int tile_rows, const PrefillTile* tiles, int num_tiles,
                          MmqActivations act, int h, int inner, float* partial, cudaStream_t stream,
                          const int* tile_count = nullptr);

// kMmqLean (expert_prefill_mmq_lean.cu; LaunchMmqGateUp / LaunchMmqDown forward to it): the same
// results as kMmqWarps16 (same integer sums, f32 steps in another order) with fewer instructions per
// MMA. warps 16 (rings of 4) or 8 (kMmqLeanWarps8, rings of 8); tile_rows 1 .. 16. gate_up: N =
// 2·inner, out_cols = inner; else N = h, out_cols = h.
cudaError_t LaunchMmqLean(bool gate_up, int warps, int tile_rows, const PrefillTile* tiles, int num_tiles,
                          MmqActivations a, const int32_t* a_index, int K, int N, int out_cols, float* out,
                          cudaStream_t stream, const int* tile_count = nullptr);

// kMmqLean2 (expert_prefill_mmq_lean2.cu; the default for small groups): kMmqLean's 16 warps
// and arithmetic (bit-identical outputs) with the per-unit descriptor read a unit ahead and the
// per-tile activation staging by cp.async, double-buffered where two tiles fit beside the ring.
// tile_rows 1 .. 16; the other arguments as LaunchMmqLean's.
cudaError_t LaunchMmqLean2(bool gate_up, int tile_rows, const PrefillTile* tiles, int num_tiles, MmqActivations a,
                           const int32_t* a_index, int K, int N, int out_cols, float* out, cudaStream_t stream,
                           const int* tile_count = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_MMQ_CUH_
