// Helpers of the GPU MoE kernel tests: GPU presence, device uploads and downloads, poisoning,
// random quantized matrices.
#ifndef TANDEM_TESTS_GPU_MOE_TEST_SUPPORT_H_
#define TANDEM_TESTS_GPU_MOE_TEST_SUPPORT_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/reference/weight_view.h"
#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "tests/reference/test_util.h"

namespace tandem::cuda::testing {

using ::tandem::testing::RandomVector;
using ::tandem::testing::RelativeL2;
using ::tandem::testing::UniformVector;

inline bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define TANDEM_SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                             \
    if (!::tandem::cuda::testing::HaveGpu()) {                                                     \
      GTEST_SKIP() << "no CUDA GPU on this machine: the GPU MoE kernel tests run on the GPU host"; \
    }                                                                                              \
  } while (0)

#define TANDEM_ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

// The layer loop's plain read norm of n rows of h (one stream, no inject weights, eps 1e-6, the
// pending inject y when not nullptr) on the legacy stream: the f32 rows alone (copies 0,
// LaunchInjectRmsNorm) or with the f16 input rows of a prepared product (copies 1 or 3 into N16,
// LaunchInjectRmsNormF16); q as the norm's NormMmqOut.
inline cudaError_t LaunchReadNorm(float* H, int64_t n, int64_t h, const float* y, const float* gamma, float* N,
                                  int copies, uint16_t* N16, const NormMmqOut* q) {
  if (copies == 0) return LaunchInjectRmsNorm(H, n, 1, h, nullptr, y, gamma, 1e-6f, N, nullptr, q);
  return LaunchInjectRmsNormF16(H, n, 1, h, nullptr, y, gamma, 1e-6f, N, copies, N16, nullptr, q);
}

// A device buffer holding `bytes` of 0xFF (NaN in every float) so that unwritten outputs show.
inline DeviceBuffer PoisonedBuffer(size_t bytes) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes);
  if (!b.ok()) ADD_FAILURE() << b.status();
  DeviceBuffer out = b.ok() ? *std::move(b) : DeviceBuffer();
  if (out.get() != nullptr) {
    EXPECT_EQ(cudaMemset(out.get(), 0xFF, bytes), cudaSuccess);
  }
  return out;
}

template <typename T>
DeviceBuffer Upload(const std::vector<T>& v) {
  DeviceBuffer b = PoisonedBuffer(v.size() * sizeof(T));
  if (b.get() != nullptr) {
    EXPECT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return b;
}

template <typename T>
std::vector<T> Download(const void* d, size_t count) {
  std::vector<T> v(count);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// rows × cols random values (normal, stddev `scale`) stored in `type`.
inline std::vector<uint8_t> RandomMatrix(std::mt19937& rng, WeightType type, int64_t cols, int64_t rows, float scale) {
  const int64_t row_bytes = *RowBytes(type, cols);
  std::vector<uint8_t> out(static_cast<size_t>(row_bytes * rows));
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> v = RandomVector(rng, cols, scale);
    QuantizeRow(type, v.data(), out.data() + r * row_bytes, cols);
  }
  return out;
}

inline MatrixView HostMatrix(WeightType type, const std::vector<uint8_t>& bytes, int64_t cols, int64_t rows) {
  return MatrixView{type, bytes.data(), cols, rows, *RowBytes(type, cols)};
}

// `count` experts' random weights (RandomMatrix, stddev 0.05): gate and up (h → I) in gu, down
// (I → h) in d, drawn gate, up, down an expert at a time; on the host and uploaded (dgate, dup,
// ddown).
struct RandomExperts {
  std::vector<std::vector<uint8_t>> gate, up, down;
  std::vector<DeviceBuffer> dgate, dup, ddown;
};
inline RandomExperts MakeRandomExperts(std::mt19937& rng, WeightType gu, WeightType d, int64_t h, int64_t I,
                                       int64_t count) {
  RandomExperts x;
  for (int64_t e = 0; e < count; ++e) {
    x.gate.push_back(RandomMatrix(rng, gu, h, I, 0.05f));
    x.up.push_back(RandomMatrix(rng, gu, h, I, 0.05f));
    x.down.push_back(RandomMatrix(rng, d, I, h, 0.05f));
    x.dgate.push_back(Upload(x.gate.back()));
    x.dup.push_back(Upload(x.up.back()));
    x.ddown.push_back(Upload(x.down.back()));
  }
  return x;
}

inline bool AllFinite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

}  // namespace tandem::cuda::testing

#endif  // TANDEM_TESTS_GPU_MOE_TEST_SUPPORT_H_
