// Integer dot-product kernels: rows of a quantized weight matrix against up to kMaxRowBlock
// outputs' quantized activation rows at once.
//
// A RowDotKernel reads `row_count` weight rows (row r at weights + r * row_bytes, each
// `blocks_per_row` blocks of the weight type) once and writes, for every output k < out_count,
//   out[k][r] = sum over t < terms of dot(row r, acts[k * terms + t]),
// each activation row blocks_per_row blocks of IntegerActivationFormat(type). terms is 1 (plain
// int8 rows) or 2 (two-term rows hi, lo: activation_blocks.h). Each weight block is decoded once
// and used for all out_count * terms rows (register-blocked), so 8 tokens on one expert cost about
// one pass over its weights. No allocation, no locks.
//
// Results equal the scalar kernel's up to f32 rounding: every ISA computes exact integer sums
// (per 32-element group; per block for Q8_0 / Q4_0; per 4 elements in the AVX-512 Q4_K / Q5_K
// kernel, where each lane is scaled in f32) and scales them by the same floats.
#ifndef TANDEM_HOST_EXPERT_WORKER_KERNELS_ROW_DOT_KERNELS_H_
#define TANDEM_HOST_EXPERT_WORKER_KERNELS_ROW_DOT_KERNELS_H_

#include <cstdint>

#include "common/weights/weight_types.h"
#include "host_expert_worker/kernels/kernel_isa.h"

namespace tandem {

inline constexpr int kMaxRowBlock = 8;  // outputs per call
inline constexpr int kMaxTerms = 2;     // activation rows per output

using RowDotKernel = void (*)(const uint8_t* weights, int64_t row_bytes, int64_t row_count,
                              int64_t blocks_per_row, const void* const* acts, int out_count,
                              int terms, float* const* out);

// The kernel for `type` on `isa`, or nullptr when that family has none for the type (then use a
// narrower family: FindBestRowDotKernel does). Float weight types have no integer kernel.
RowDotKernel FindRowDotKernel(KernelIsa isa, WeightType type);

// The widest kernel for `type` among the families up to and including `isa`, with the family it
// comes from in *used (when non-null); nullptr for float weight types.
RowDotKernel FindBestRowDotKernel(KernelIsa isa, WeightType type, KernelIsa* used = nullptr);

namespace row_dot_internal {
// Per-family tables (row_dot_scalar.cc, row_dot_avx2.cc, row_dot_avx512.cc).
RowDotKernel ScalarKernel(WeightType type);
RowDotKernel Avx2Kernel(WeightType type);
RowDotKernel Avx512VnniKernel(WeightType type);
}  // namespace row_dot_internal

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_KERNELS_ROW_DOT_KERNELS_H_
