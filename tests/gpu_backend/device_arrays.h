// Device arrays for the backend's kernel-level tests (device_plan_test.cc, route_plan_grid_test.cc):
// raw cudaMalloc'd copies that live until the test process ends (a test makes a handful), with
// failures reported through gtest.
#ifndef TANDEM_TESTS_GPU_BACKEND_DEVICE_ARRAYS_H_
#define TANDEM_TESTS_GPU_BACKEND_DEVICE_ARRAYS_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::gpu_backend_testing {

// A device array of `count` T (at least one), its bytes set to `fill` (0xFF: unwritten outputs show).
template <typename T>
T* DeviceArrayOf(size_t count, int fill = 0xFF) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, count) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemset(d, fill, std::max<size_t>(1, count) * sizeof(T)), cudaSuccess);
  return d;
}

// A device copy of v.
template <typename T>
T* DeviceCopy(const std::vector<T>& v) {
  T* d = DeviceArrayOf<T>(v.size());
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return d;
}

// The first n elements of device array d.
template <typename T>
std::vector<T> HostCopy(const T* d, size_t n) {
  std::vector<T> v(n);
  if (n > 0) {
    EXPECT_EQ(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return v;
}

}  // namespace tandem::gpu_backend_testing

#endif  // TANDEM_TESTS_GPU_BACKEND_DEVICE_ARRAYS_H_
