// The two ceilings a benchmark on the GPU is held against, measured in the same run as the
// benchmark itself: HBM read bandwidth (a kernel that reads a buffer far larger than L2 once and
// writes almost nothing) and the dense bf16 GEMM rate of cuBLAS (f32 accumulation).
#ifndef TANDEM_TESTS_GPU_BACKEND_BENCH_CEILINGS_H_
#define TANDEM_TESTS_GPU_BACKEND_BENCH_CEILINGS_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace tandem::bench {

// Bytes per second read from device memory: best of `repeats` passes over `bytes` (rounded down
// to 16-byte words) with 16-byte loads.
absl::StatusOr<double> MeasureHbmReadBandwidth(uint64_t bytes, int repeats);

// FLOP/s of one bf16 × bf16 → f32 cuBLAS GEMM of m × n × k (2·m·n·k flops per call), best of
// `repeats` after one warm-up.
absl::StatusOr<double> MeasureBf16GemmRate(int m, int n, int k, int repeats);

}  // namespace tandem::bench

#endif  // TANDEM_TESTS_GPU_BACKEND_BENCH_CEILINGS_H_
