#include "common/reference/matmul.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "common/reference/ops.h"
#include "common/reference/thread_pool.h"
#include "gtest/gtest.h"
#include "tests/reference/test_util.h"

namespace tandem {
namespace {

using testing::RandomVector;
using testing::RelativeL2;

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

// A matrix in some block format together with its exact f32 values (DequantizeRow's).
struct TestMatrix {
  WeightType type;
  int64_t cols, rows, row_bytes;
  std::vector<uint8_t> bytes;
  std::vector<float> values;

  MatrixView view() const { return MatrixView{type, bytes.data(), cols, rows, row_bytes}; }
  MatrixView f32_view() const { return F32Matrix(values.data(), cols, rows); }
};

TestMatrix QuantizedMatrix(WeightType type, const std::vector<float>& w, int64_t cols, int64_t rows) {
  TestMatrix m{type, cols, rows, *RowBytes(type, cols), {}, std::vector<float>(w.size())};
  m.bytes.resize(static_cast<size_t>(rows * m.row_bytes));
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeRow(type, w.data() + r * cols, m.bytes.data() + r * m.row_bytes, cols);
    DequantizeRow(type, m.bytes.data() + r * m.row_bytes, m.values.data() + r * cols, cols);
  }
  return m;
}

std::vector<MatMulIsa> SupportedIsas() {
  std::vector<MatMulIsa> isas;
  for (MatMulIsa isa : {MatMulIsa::kScalar, MatMulIsa::kAvx2, MatMulIsa::kAvx512}) {
    if (MatMulIsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

// Bitwise equality (NaN payloads included), unlike operator== on floats.
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> Product(MatMulIsa isa, const MatrixView& w, const std::vector<float>& x, int64_t n,
                           ThreadPool* pool) {
  std::vector<float> y(static_cast<size_t>(n * w.rows));
  MatMulWithIsa(isa, w, x.data(), n, y.data(), pool);
  return y;
}

TEST(MatMulTest, BestIsaIsSupported) {
  EXPECT_TRUE(MatMulIsaSupported(MatMulIsa::kScalar));
  EXPECT_TRUE(MatMulIsaSupported(BestMatMulIsa()));
  EXPECT_EQ(MatMulIsaName(MatMulIsa::kAvx512), "avx512");
}

// The error bound of matmul.h: |y - exact| <= 2^-24 |exact| + γ10 Σ|w x|, per element; and the
// relative L2 error on random data stays far below 1e-6.
TEST(MatMulTest, WithinTheStatedBoundOfTheExactProduct) {
  std::mt19937 rng(7);
  const double u = std::ldexp(1.0, -24);
  const double gamma10 = 10 * u / (1 - 10 * u);
  for (auto [cols, rows, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {33, 17, 1}, {64, 70, 5},
                               {257, 9, 13}, {2048 + 40, 11, 3}, {4096, 64, 2}}) {
    const std::vector<float> w = RandomVector(rng, cols * rows);
    const std::vector<float> x = RandomVector(rng, n * cols);
    std::vector<float> reference(static_cast<size_t>(n * rows));
    for (MatMulIsa isa : SupportedIsas()) {
      const std::vector<float> y = Product(isa, F32Matrix(w.data(), cols, rows), x, n, nullptr);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          double exact = 0.0, magnitude = 0.0;
          for (int64_t c = 0; c < cols; ++c) {
            const double p = static_cast<double>(w[r * cols + c]) * x[t * cols + c];
            exact += p;
            magnitude += std::fabs(p);
          }
          reference[t * rows + r] = static_cast<float>(exact);
          const double bound = 1.0001 * (u * std::fabs(exact) + gamma10 * magnitude);
          ASSERT_LE(std::fabs(y[t * rows + r] - exact), bound)
              << MatMulIsaName(isa) << " " << cols << "x" << rows << " t=" << t << " r=" << r;
        }
      }
      EXPECT_LE(RelativeL2(y, reference), 1e-6) << MatMulIsaName(isa) << " " << cols << "x" << rows;
    }
  }
}

// Every weight format, on every instruction set: the same bits as the scalar variant, and as the
// product with the matrix's dequantized f32 copy. Shapes cover short tail chunks (float and
// legacy formats), row counts that are not a multiple of the row tile, and token counts on both
// sides of the packing threshold and the token tile.
TEST(MatMulTest, EveryFormatAndIsaGivesTheBitsOfTheDequantizedProduct) {
  std::mt19937 rng(9);
  struct Shape {
    WeightType type;
    int64_t cols;
  };
  for (Shape shape : {Shape{WeightType::kF32, 300}, Shape{WeightType::kF16, 300}, Shape{WeightType::kBF16, 520},
                      Shape{WeightType::kQ4_0, 288}, Shape{WeightType::kQ8_0, 544}, Shape{WeightType::kQ2_K, 512},
                      Shape{WeightType::kQ3_K, 512}, Shape{WeightType::kQ4_K, 512}, Shape{WeightType::kQ5_K, 512},
                      Shape{WeightType::kQ6_K, 512}}) {
    const int64_t rows = 7;
    const TestMatrix m = QuantizedMatrix(shape.type, RandomVector(rng, shape.cols * rows), shape.cols, rows);
    for (int64_t n : {1, 3, 9, 17}) {
      const std::vector<float> x = RandomVector(rng, n * shape.cols);
      const std::vector<float> scalar = Product(MatMulIsa::kScalar, m.view(), x, n, nullptr);
      ASSERT_TRUE(SameBits(scalar, Product(MatMulIsa::kScalar, m.f32_view(), x, n, nullptr)))
          << GetWeightTypeInfo(shape.type).name << " n=" << n;
      for (MatMulIsa isa : SupportedIsas()) {
        EXPECT_TRUE(SameBits(scalar, Product(isa, m.view(), x, n, nullptr)))
            << GetWeightTypeInfo(shape.type).name << " " << MatMulIsaName(isa) << " n=" << n;
        EXPECT_TRUE(SameBits(scalar, Product(isa, m.f32_view(), x, n, nullptr)))
            << GetWeightTypeInfo(shape.type).name << " f32 copy " << MatMulIsaName(isa) << " n=" << n;
      }
    }
  }
}

// Every finite f16 and bf16 value (subnormals included) converts exactly as DequantizeRow does.
TEST(MatMulTest, HalfConversionsCoverEveryFiniteValue) {
  std::mt19937 rng(10);
  const int64_t cols = 256;
  for (WeightType type : {WeightType::kF16, WeightType::kBF16}) {
    std::vector<uint16_t> bits;
    for (uint32_t h = 0; h < 65536; ++h) {
      const bool finite = type == WeightType::kF16 ? ((h >> 10) & 0x1F) != 0x1F : ((h >> 7) & 0xFF) != 0xFF;
      if (finite) bits.push_back(static_cast<uint16_t>(h));
    }
    ASSERT_EQ(bits.size() % cols, 0u);
    const int64_t rows = static_cast<int64_t>(bits.size()) / cols;
    const MatrixView w{type, bits.data(), cols, rows, 2 * cols};
    std::vector<float> values(bits.size());
    DequantizeRow(type, bits.data(), values.data(), static_cast<int64_t>(bits.size()));
    const std::vector<float> x = RandomVector(rng, 2 * cols, 1e-3f);
    const std::vector<float> expected = Product(MatMulIsa::kScalar, F32Matrix(values.data(), cols, rows), x, 2, nullptr);
    for (MatMulIsa isa : SupportedIsas()) {
      EXPECT_TRUE(SameBits(expected, Product(isa, w, x, 2, nullptr)))
          << GetWeightTypeInfo(type).name << " " << MatMulIsaName(isa);
    }
  }
}

// Row t of a batch is bitwise what a batch of one gives for it (prefill equals decode), on any
// thread count.
TEST(MatMulTest, BatchRowsEqualSingleRowProducts) {
  std::mt19937 rng(11);
  const int64_t cols = 2048, rows = 45, n = 21;  // power-of-two cols: the packed activation path
  const TestMatrix m = QuantizedMatrix(WeightType::kQ4_K, RandomVector(rng, cols * rows), cols, rows);
  const std::vector<float> x = RandomVector(rng, n * cols);
  ThreadPool three(3);
  for (MatMulIsa isa : SupportedIsas()) {
    const std::vector<float> batch = Product(isa, m.view(), x, n, &three);
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
      const std::vector<float> single = Product(isa, m.view(), xt, 1, nullptr);
      const std::vector<float> batch_row(batch.begin() + t * rows, batch.begin() + (t + 1) * rows);
      ASSERT_TRUE(SameBits(single, batch_row)) << MatMulIsaName(isa) << " t=" << t;
    }
  }
}

TEST(MatMulTest, ThreadedEqualsSingleThreadedBitwise) {
  std::mt19937 rng(8);
  const int64_t cols = 512, rows = 301, n = 7;
  const TestMatrix m = QuantizedMatrix(WeightType::kQ8_0, RandomVector(rng, cols * rows), cols, rows);
  const std::vector<float> x = RandomVector(rng, n * cols);
  ThreadPool one(1), four(4);
  EXPECT_TRUE(SameBits(Product(BestMatMulIsa(), m.view(), x, n, &one), Product(BestMatMulIsa(), m.view(), x, n, &four)));
  std::vector<float> y(static_cast<size_t>(n * rows));
  MatMul(m.view(), x.data(), n, y.data(), &four);
  EXPECT_TRUE(SameBits(y, Product(BestMatMulIsa(), m.view(), x, n, nullptr)));
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
