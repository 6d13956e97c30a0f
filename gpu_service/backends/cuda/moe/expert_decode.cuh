// The routed-expert decode kernels: for lists of ExpertUnits (expert_unit.h), the fused
// gate/up + SiLU kernel and the down kernel, f32 activations and f32 accumulation (the exact
// mode), weights dequantized on the fly from the ggml block layouts. matvec.cu routes
// LaunchExpertGateUp / LaunchExpertDown (matvec.cuh, same contract) here for the types
// ExpertDecodeRoutesType names.
//
// All kernels here are launched with programmatic dependent launch (../pdl.cuh) and follow its
// rule: nothing is read before PdlWaitForPrevious (the unit list is the previous kernel's output).
//
// Per-piece geometry (1.16-1.26x faster than the older kernel on Q4_K as measured, PERF_NOTES.md): one warp
// per (unit, step of G output rows), a row split over L lanes (L a power of two dividing the
// row's 32-element pieces, so that every lane owns a few pieces of its row); each lane first
// issues the raw loads of all its pieces of the step (gate and up together in the fused kernel)
// and only then decodes them. Activations are read from
// global memory through L1 (no shared tile), and only for the unit's actual rows (u.rows), so the
// cost of a unit is its weight bytes plus work proportional to its rows. Q4_K pieces are decoded
// from 16-byte loads without local memory; the other types use dequant.cuh's DequantChunk.
//
// Host-compiler safe (no device code): the benchmark includes it to pick the kernel.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/moe/expert_unit.h"

namespace tandem::cuda {

// Same contract as LaunchExpertGateUp of matvec.cuh: for every unit u (index < *device_num_units
// when given) and r < u.rows, act[u.first_slot + r] = SiLU(gate_u·x[u.input_row[r]]) ⊙ up_u·x[...].
// cudaErrorInvalidValue for a type the kernel cannot read, h not a multiple of the type's row
// length multiple (weight_type_ids.h), max_rows outside [1, kMaxUnitRows] or inner < 1.
cudaError_t LaunchExpertDecodeGateUp(uint32_t type, const ExpertUnit* units, int num_units, int max_rows, int h,
                                     int inner, const float* x, float* act, cudaStream_t stream,
                                     const int* device_num_units);

// Same contract as LaunchExpertDown of matvec.cuh: partial[u.first_slot + r] = down_u·act[u.first_slot + r].
cudaError_t LaunchExpertDecodeDown(uint32_t type, const ExpertUnit* units, int num_units, int max_rows, int inner,
                                   int h, const float* act, float* partial, cudaStream_t stream,
                                   const int* device_num_units);

// Which kernel LaunchExpertGateUp / LaunchExpertDown run. kDecode (the default): this file's
// kernels for the types ExpertDecodeRoutesType names (Q4_K: the tile kernel of
// expert_decode_q4k.cuh where the row length fits it), the older kernel of matvec_impl.cuh for the
// others; kDecodePieces: the same, but Q4_K through this file's per-piece kernel (the default until
// 2026-12-01), also under LaunchExpertDecode*; kGeneric: the older kernel for every type. The other
// choices stay selectable so that the benchmark can time all in one run. Process-wide, not
// thread-safe against concurrent launches (a benchmark knob).
enum class ExpertKernelChoice { kDecode, kGeneric, kDecodePieces };
void SetExpertKernelChoice(ExpertKernelChoice choice);
ExpertKernelChoice GetExpertKernelChoice();

// True for the matrix types that LaunchExpertGateUp / LaunchExpertDown hand to this file's kernel
// under kDecode: Q4_K only. It reads every MoE type (the tests cover them all), but its generic
// path (dequant.cuh's DequantChunk per piece) measured slower than the older kernel on Q2_K gate/up
// (PERF_NOTES.md), and the other types are unmeasured.
bool ExpertDecodeRoutesType(uint32_t type);

// Steps (groups of output rows) each warp walks, for the per-piece and the Q4_K tile kernels; 0
// (the default) picks, for the per-piece kernel, 1 for a launch of about one wave, else 2; for the
// tile kernel 1. A benchmark knob, process-wide.
void SetExpertDecodeStepsPerWarp(int steps);

// Warps per block of the Q4_K tile kernel: 2, 4 or 8 forced; anything else selects the rule (4 for
// launches of about one wave, 8 above; expert_decode_q4k.cuh). A benchmark knob, process-wide.
void SetExpertDecodeTileWarps(int warps);

// Pieces (32 elements) each lane owns of its row at least, where the row allows: fewer lanes per
// row, more rows per warp step. 0 selects the default, 4. A benchmark knob, process-wide.
void SetExpertDecodeMinPiecesPerLane(int pieces);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_CUH_
