#include "common/reference/matmul.h"

#include <atomic>
#include <vector>

#include "common/reference/ops.h"
#include "common/reference/thread_pool.h"
#include "gtest/gtest.h"
#include "tests/reference/test_util.h"

namespace tandem {
namespace {

using testing::RandomVector;

TEST(ThreadPoolTest, CoversEveryIndexOnceForAnyThreadCount) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t total : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(total));
      pool.ParallelFor(0, total, 3, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < total; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << total << " " << i;
    }
  }
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool(4);
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(0, 8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(0, 10, 1, [&](int64_t b2, int64_t e2) { sum += (e2 - b2) * (i + 1); });
    }
  });
  EXPECT_EQ(sum.load(), 10 * (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8));
}

TEST(MatMulTest, EqualsNaiveF64Product) {
  std::mt19937 rng(7);
  for (auto [cols, rows, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {33, 17, 1}, {64, 70, 5},
                               {257, 9, 13}}) {
    const std::vector<float> w = RandomVector(rng, cols * rows);
    const std::vector<float> x = RandomVector(rng, n * cols);
    std::vector<float> y(static_cast<size_t>(n * rows));
    MatMul(F32Matrix(w.data(), cols, rows), x.data(), n, y.data(), nullptr);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double ref = 0.0;
        for (int64_t c = 0; c < cols; ++c) ref += static_cast<double>(w[r * cols + c]) * x[t * cols + c];
        // f64 accumulation, one rounding to f32 at the end.
        ASSERT_NEAR(y[t * rows + r], ref, 1e-6 * (1.0 + std::fabs(ref))) << cols << "x" << rows << " t=" << t;
      }
    }
  }
}

TEST(MatMulTest, ThreadedEqualsSingleThreadedBitwise) {
  std::mt19937 rng(8);
  const int64_t cols = 96, rows = 301, n = 7;
  const std::vector<float> w = RandomVector(rng, cols * rows);
  const std::vector<float> x = RandomVector(rng, n * cols);
  std::vector<float> serial(static_cast<size_t>(n * rows)), threaded(serial.size());
  ThreadPool one(1), four(4);
  MatMul(F32Matrix(w.data(), cols, rows), x.data(), n, serial.data(), &one);
  MatMul(F32Matrix(w.data(), cols, rows), x.data(), n, threaded.data(), &four);
  EXPECT_EQ(serial, threaded);
}

TEST(MatMulTest, QuantizedRowsAreDequantizedOnce) {
  // A Q8_0 matrix must give exactly the product with its dequantized f32 copy.
  std::mt19937 rng(9);
  const int64_t cols = 64, rows = 19, n = 3;
  const std::vector<float> w = RandomVector(rng, cols * rows);
  const int64_t row_bytes = *RowBytes(WeightType::kQ8_0, cols);
  std::vector<uint8_t> q(static_cast<size_t>(rows * row_bytes));
  std::vector<float> deq(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeRow(WeightType::kQ8_0, w.data() + r * cols, q.data() + r * row_bytes, cols);
    DequantizeRow(WeightType::kQ8_0, q.data() + r * row_bytes, deq.data() + r * cols, cols);
  }
  const std::vector<float> x = RandomVector(rng, n * cols);
  std::vector<float> yq(static_cast<size_t>(n * rows)), yf(yq.size());
  ThreadPool pool(3);
  MatMul(MatrixView{WeightType::kQ8_0, q.data(), cols, rows, row_bytes}, x.data(), n, yq.data(), &pool);
  MatMul(F32Matrix(deq.data(), cols, rows), x.data(), n, yf.data(), nullptr);
  EXPECT_EQ(yq, yf);
}

TEST(OpsTest, RmsNormSoftmaxAndActivations) {
  const float x[4] = {1.0f, -2.0f, 3.0f, -4.0f};
  const float gamma[4] = {1.0f, 2.0f, 0.5f, 1.0f};
  float y[4];
  RmsNorm(x, 4, 0.0f, gamma, y);
  const double inv = 1.0 / std::sqrt((1.0 + 4.0 + 9.0 + 16.0) / 4.0);
  EXPECT_NEAR(y[1], -2.0 * inv * 2.0, 1e-6);
  EXPECT_NEAR(y[2], 3.0 * inv * 0.5, 1e-6);
  float s[3] = {1.0f, 2.0f, 3.0f};
  Softmax(s, 3);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(s[0], std::exp(1.0) / z, 1e-7);
  EXPECT_NEAR(s[2], std::exp(3.0) / z, 1e-7);
  EXPECT_NEAR(Softplus(0.0f), std::log(2.0), 1e-7);
  EXPECT_EQ(Softplus(30.0f), 30.0f);
  EXPECT_NEAR(Silu(1.0f), 1.0 / (1.0 + std::exp(-1.0)), 1e-7);
}

}  // namespace
}  // namespace tandem
