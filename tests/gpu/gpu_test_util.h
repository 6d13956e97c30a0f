// Helpers of the GPU parity driver: device detection (tests skip without a GPU), device copies of
// host vectors, poisoning, random quantized weights and error measures.
#ifndef TANDEM_TESTS_GPU_GPU_TEST_UTIL_H_
#define TANDEM_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/reference/weight_view.h"
#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gtest/gtest.h"

namespace tandem::gpu_testing {

// Empty when a CUDA device is usable, else the reason to skip.
inline std::string NoGpuReason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
  if (count == 0) return "no CUDA device present";
  return "";
}

#define TANDEM_SKIP_WITHOUT_GPU()                                                    \
  do {                                                                              \
    if (std::string reason = ::tandem::gpu_testing::NoGpuReason(); !reason.empty()) \
      GTEST_SKIP() << "GPU test skipped: " << reason;                               \
  } while (0)

#define TANDEM_ASSERT_CUDA(call)                                                  \
  do {                                                                            \
    const cudaError_t tandem_e_ = (call);                                         \
    ASSERT_EQ(tandem_e_, cudaSuccess) << #call << ": " << cudaGetErrorString(tandem_e_); \
  } while (0)

// A device array with its size; Upload / Download copy synchronously.
template <typename T>
struct DeviceArray {
  cuda::DeviceBuffer buffer;
  size_t count = 0;
  T* get() const { return buffer.as<T>(); }
};

template <typename T>
DeviceArray<T> Alloc(size_t count) {
  DeviceArray<T> a;
  auto b = cuda::DeviceBuffer::Allocate(std::max<size_t>(count, 1) * sizeof(T));
  EXPECT_TRUE(b.ok()) << b.status();
  if (b.ok()) a.buffer = *std::move(b);
  a.count = count;
  return a;
}

// Allocates count elements filled with 0xFF bytes (NaN for floats, -1 for ints).
template <typename T>
DeviceArray<T> Poisoned(size_t count) {
  DeviceArray<T> a = Alloc<T>(count);
  EXPECT_EQ(cudaMemset(a.get(), 0xFF, std::max<size_t>(count, 1) * sizeof(T)), cudaSuccess);
  return a;
}

template <typename T>
DeviceArray<T> Upload(const std::vector<T>& v) {
  DeviceArray<T> a = Alloc<T>(v.size());
  EXPECT_EQ(cudaMemcpy(a.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return a;
}

template <typename T>
std::vector<T> Download(const DeviceArray<T>& a) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<T> v(a.count);
  EXPECT_EQ(cudaMemcpy(v.data(), a.get(), a.count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

inline std::vector<float> Random(std::mt19937& rng, size_t n, float stddev = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// ‖a − b‖ / ‖b‖; infinity when a holds a NaN (an unwritten, poisoned element).
inline double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return den == 0.0 ? (num == 0.0 ? 0.0 : INFINITY) : std::sqrt(num / den);
}

// Records a measured error in the test's XML properties and prints it (scientific notation), so
// that device runs report the parity numbers, not only pass/fail; returns err for EXPECT_LE.
inline double LogError(const std::string& what, double err) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3e", err);
  ::testing::Test::RecordProperty(what, buf);
  std::printf("[ parity   ] %s rel_l2=%s\n", what.c_str(), buf);
  return err;
}

// A random {cols, rows} matrix quantized to `type` on the host, with its device copy.
struct TestMatrix {
  WeightType type;
  int64_t cols, rows, row_bytes;
  std::vector<uint8_t> bytes;
  DeviceArray<uint8_t> device;

  MatrixView view() const { return MatrixView{type, bytes.data(), cols, rows, row_bytes}; }
  cuda::DeviceMatrix gpu() const {
    return cuda::DeviceMatrix{static_cast<uint32_t>(type), device.get(), cols, rows, row_bytes};
  }
};

inline TestMatrix RandomMatrix(std::mt19937& rng, WeightType type, int64_t cols, int64_t rows,
                               float stddev = 1.0f) {
  TestMatrix m{type, cols, rows, *RowBytes(type, cols), {}, {}};
  m.bytes.resize(static_cast<size_t>(m.row_bytes * rows));
  const std::vector<float> f = Random(rng, static_cast<size_t>(cols * rows), stddev);
  for (int64_t r = 0; r < rows; ++r) QuantizeRow(type, f.data() + r * cols, m.bytes.data() + r * m.row_bytes, cols);
  m.device = Upload(m.bytes);
  return m;
}

// A Q8_0 test matrix regrouped to Q8_0x8 (device_matrix.h), at `offset` bytes into its allocation,
// rows `pad` bytes apart beyond the natural stride (padding and slack hold 0xFF bytes, which must
// never be read).
struct Regrouped {
  DeviceArray<uint8_t> device;
  cuda::DeviceMatrix m;
};
inline Regrouped Regroup(const TestMatrix& w, int64_t pad = 0, int64_t offset = 0) {
  const int64_t natural = cuda::Q8_0x8RowBytes(w.cols), row_bytes = natural + pad;
  std::vector<uint8_t> packed(static_cast<size_t>(natural * w.rows));
  cuda::RepackQ8_0x8(w.bytes.data(), w.row_bytes, w.rows, w.cols, packed.data());
  std::vector<uint8_t> bytes(static_cast<size_t>(offset + row_bytes * w.rows + 16), 0xFF);
  for (int64_t r = 0; r < w.rows; ++r) std::memcpy(&bytes[offset + r * row_bytes], &packed[r * natural], natural);
  Regrouped g{Upload(bytes), {}};
  g.m = cuda::DeviceMatrix{cuda::kTypeQ8_0x8, g.device.get() + offset, w.cols, w.rows, row_bytes};
  return g;
}

// y0 + W·x in f64 over W's dequantized rows (y0 may be empty: zeros), rounded to f32.
inline std::vector<float> HostProduct(const TestMatrix& w, const std::vector<float>& x,
                                      const std::vector<float>& y0 = {}) {
  std::vector<float> y(static_cast<size_t>(w.rows)), row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeRow(w.type, w.bytes.data() + r * w.row_bytes, row.data(), w.cols);
    double sum = y0.empty() ? 0.0 : y0[r];
    for (int64_t c = 0; c < w.cols; ++c) sum += static_cast<double>(row[c]) * x[c];
    y[r] = static_cast<float>(sum);
  }
  return y;
}

inline TestMatrix F32TestMatrix(const std::vector<float>& f, int64_t cols, int64_t rows) {
  TestMatrix m{WeightType::kF32, cols, rows, cols * 4, {}, {}};
  m.bytes.resize(f.size() * 4);
  std::memcpy(m.bytes.data(), f.data(), m.bytes.size());
  m.device = Upload(m.bytes);
  return m;
}

inline const std::vector<WeightType>& GpuTypes() {
  static const std::vector<WeightType> types = {WeightType::kF32,  WeightType::kF16,  WeightType::kBF16,
                                                WeightType::kQ8_0, WeightType::kQ4_K, WeightType::kQ5_K,
                                                WeightType::kQ6_K};
  return types;
}

// A DenseGemm plan for the tests' products: up to 64 activation rows of `cols`, weight tiles of
// 100 rows (several tiles for every test matrix when the product dequantizes per call).
inline cuda::DenseGemmOptions SmallGemmOptions(cuda::GemmMode mode, int64_t cols) {
  cuda::DenseGemmOptions options;
  options.mode = mode;
  options.max_n = 64;
  options.max_cols = cols;
  options.tile_bytes = 100 * cols * 4;
  options.workspace_bytes = 4 << 20;
  return options;
}

// Whether a and b hold the same bits (and length).
template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The first index where a and b differ in bits (the shorter length when one is a prefix of the
// other), or -1 when they are the same.
template <typename T>
int64_t FirstDifference(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(std::min(a.size(), b.size()));
}

}  // namespace tandem::gpu_testing

#endif  // TANDEM_TESTS_GPU_GPU_TEST_UTIL_H_
