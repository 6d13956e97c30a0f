// Embedding gather: H_s = token_embd[token] for every stream s (docs/MODEL.md §4.1), dequantized
// on the GPU from the stored block format to f32.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_EMBEDDING_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_EMBEDDING_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

// For each of the n tokens (device array), writes its row of `table` ({h, V}: table.cols = h) as
// f32 into H[(t·S + s)·h ...] for s < S. A token id outside [0, table.rows) is a caller bug: its
// rows are filled with NaN so that the error shows downstream instead of reading stray memory. cudaErrorInvalidValue for an unsupported type or h not a multiple of 32.
cudaError_t LaunchEmbeddingGather(const DeviceMatrix& table, const int32_t* tokens, int64_t n,
                                  int64_t S, float* H, cudaStream_t stream);

// Device byte ranges a gather's launch also sets, each to one byte value: zeroes for the decode
// step's accumulators (the fused MoE kernel's y and router counters, the mixers' output rows),
// which memset nodes ahead of the gather cleared before, and 0xFF for the GDN layers' polled rows
// (their unwritten marker, dense_matvec.cuh RowsPolled). A memset node is a launch of its own in
// the step's chain and cannot overlap its neighbours as PDL launches do; extra blocks of the
// gather's grid cost neither. Each range 16-byte aligned; at most kGatherMaxRanges.
inline constexpr int kGatherMaxRanges = 4;
struct GatherRanges {
  void* p[kGatherMaxRanges] = {};
  size_t bytes[kGatherMaxRanges] = {};
  uint8_t fill[kGatherMaxRanges] = {};  // every byte of the range gets this (0: zeroed)
  int count = 0;
  // Appends [p, p + bytes), each byte set to `byte`; false when full (the caller sets that range
  // itself).
  bool Add(void* ptr, size_t n, uint8_t byte = 0) {
    if (count == kGatherMaxRanges) return false;
    p[count] = ptr;
    bytes[count] = n;
    fill[count] = byte;
    ++count;
    return true;
  }
};

// The gather with `ranges` set by extra blocks of the same launch (after its PDL wait,
// pdl.cuh, so that the ranges' readers and writers of the step before have completed). n may be 0
// (the ranges alone). cudaErrorInvalidValue also for a misaligned range.
cudaError_t LaunchEmbeddingGather(const DeviceMatrix& table, const int32_t* tokens, int64_t n,
                                  int64_t S, float* H, const GatherRanges& ranges, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_EMBEDDING_CUH_
