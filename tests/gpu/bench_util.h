// Helpers of the GPU micro-benchmarks (tests/gpu, tests/gpu_moe): failing fast on a CUDA, Abseil
// or cuBLAS error, and the median time of a launch repeated. Benchmarks are not tests: they exit
// on the first error instead of reporting it.
#ifndef TANDEM_TESTS_GPU_BENCH_UTIL_H_
#define TANDEM_TESTS_GPU_BENCH_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define BENCH_CHECK(call)                                                                        \
  do {                                                                                           \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) {                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// For an absl::Status (the caller includes Abseil).
#define BENCH_OK(expr)                                                               \
  do {                                                                               \
    if (absl::Status s_ = (expr); !s_.ok()) {                                        \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, s_.ToString().c_str()); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace tandem::bench {

// Median over 5 rounds of the milliseconds per call of fn, each round `reps` calls timed with
// CUDA events on the default stream, after `warmup` untimed calls.
inline double TimeMs(const std::function<void()>& fn, int reps = 20, int warmup = 2) {
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn();
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int round = 0; round < 5; ++round) {
    BENCH_CHECK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) fn();
    BENCH_CHECK(cudaEventRecord(b));
    BENCH_CHECK(cudaEventSynchronize(b));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / reps);
  }
  BENCH_CHECK(cudaGetLastError());
  BENCH_CHECK(cudaEventDestroy(a));
  BENCH_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace tandem::bench

#endif  // TANDEM_TESTS_GPU_BENCH_UTIL_H_
