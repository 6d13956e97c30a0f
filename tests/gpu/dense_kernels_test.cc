// Parity of the dense GPU kernels with the CPU reference: embedding gather, matvec, prefill GEMM
// (streams_kernels_test.cc has the stream read / inject, gemm_glue_test.cc the products' glue,
// gemm_split_study_test.cc the f16 split on realistic operands). Fresh random inputs, outputs
// poisoned before every run.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/reference/matmul.h"
#include "common/weights/half.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/embedding.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RandomMatrix;
using gpu_testing::RelL2;
using gpu_testing::Upload;

class GpuDenseTest : public ::testing::TestWithParam<WeightType> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

std::string TypeName(const ::testing::TestParamInfo<WeightType>& info) {
  return std::string(GetWeightTypeInfo(info.param).name);
}

TEST_P(GpuDenseTest, EmbeddingGatherMatchesDequantizedRows) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t h = 512, V = 61, S = 3;
  const gpu_testing::TestMatrix table = RandomMatrix(rng, GetParam(), h, V);
  const std::vector<int32_t> tokens = {5, 0, 60, 17, 5};
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto d_tokens = Upload(tokens);
  auto d_H = Poisoned<float>(static_cast<size_t>(n * S * h));
  TANDEM_ASSERT_CUDA(cuda::LaunchEmbeddingGather(table.gpu(), d_tokens.get(), n, S, d_H.get(), nullptr));
  const std::vector<float> got = Download(d_H);
  std::vector<float> want(got.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t s = 0; s < S; ++s) DequantizeMatrixRow(table.view(), tokens[t], want.data() + (t * S + s) * h);
  }
  EXPECT_LE(gpu_testing::LogError("embedding", RelL2(got, want)), 1e-6);
}

// The gather's launch zeroes the ranges it is given, or fills them with their byte (whole and
// partial 16-byte units, several ranges, ranges alone with no token), and writes the same rows as
// without them; a misaligned or null range is refused.
TEST_P(GpuDenseTest, EmbeddingGatherZeroesItsRanges) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t h = 256, V = 40, S = 2;
  const gpu_testing::TestMatrix table = RandomMatrix(rng, GetParam(), h, V);
  auto d_tokens = Upload(std::vector<int32_t>{7, 39});
  auto d_plain = Poisoned<float>(static_cast<size_t>(2 * S * h));
  TANDEM_ASSERT_CUDA(cuda::LaunchEmbeddingGather(table.gpu(), d_tokens.get(), 2, S, d_plain.get(), nullptr));
  const std::vector<float> plain = Download(d_plain);
  for (int64_t n : {int64_t{2}, int64_t{0}}) {
    // 1 MB (more units than the zeroing blocks' threads: a strided loop), 20 bytes, 16 bytes, zeroed,
    // and 36 bytes filled with 0xA5.
    const std::vector<size_t> sizes = {size_t{1} << 20, 20, 16, 36};
    const std::vector<uint8_t> fills = {0, 0, 0, 0xA5};
    std::vector<gpu_testing::DeviceArray<uint8_t>> ranges;
    cuda::GatherRanges zero;
    for (size_t r = 0; r < sizes.size(); ++r) {
      ranges.push_back(Poisoned<uint8_t>(sizes[r] + 16));  // 16 poisoned bytes after each range
      ASSERT_TRUE(zero.Add(ranges.back().get(), sizes[r], fills[r]));
    }
    auto d_H = Poisoned<float>(static_cast<size_t>(2 * S * h));
    TANDEM_ASSERT_CUDA(cuda::LaunchEmbeddingGather(table.gpu(), d_tokens.get(), n, S, d_H.get(), zero, nullptr));
    const std::vector<float> got = Download(d_H);
    if (n == 2) {
      EXPECT_EQ(std::memcmp(got.data(), plain.data(), got.size() * sizeof(float)), 0) << "rows changed by the ranges";
    }
    for (size_t r = 0; r < sizes.size(); ++r) {
      const std::vector<uint8_t> bytes = Download(ranges[r]);
      for (size_t i = 0; i < bytes.size(); ++i) {
        ASSERT_EQ(bytes[i], i < sizes[r] ? fills[r] : 0xFF) << "n " << n << " range " << r << " byte " << i;
      }
    }
  }
  cuda::GatherRanges bad;
  auto d_bytes = Poisoned<uint8_t>(64);
  ASSERT_TRUE(bad.Add(d_bytes.get() + 4, 16));
  auto d_H = Poisoned<float>(static_cast<size_t>(2 * S * h));
  EXPECT_EQ(cuda::LaunchEmbeddingGather(table.gpu(), d_tokens.get(), 2, S, d_H.get(), bad, nullptr),
            cudaErrorInvalidValue);
  cuda::GatherRanges null_range;
  ASSERT_TRUE(null_range.Add(nullptr, 16));
  EXPECT_EQ(cuda::LaunchEmbeddingGather(table.gpu(), d_tokens.get(), 2, S, d_H.get(), null_range, nullptr),
            cudaErrorInvalidValue);
  cuda::GatherRanges full;
  for (int i = 0; i < cuda::kGatherMaxRanges; ++i) EXPECT_TRUE(full.Add(d_bytes.get(), 16));
  EXPECT_FALSE(full.Add(d_bytes.get(), 16));
}

TEST_P(GpuDenseTest, MatVecMatchesReferenceForOneToEightRows) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t cols = 1024, rows = 301;
  const gpu_testing::TestMatrix w = RandomMatrix(rng, GetParam(), cols, rows, 0.05f);
  for (int n : {1, 2, 3, 5, 8}) {
    const std::vector<float> x = Random(rng, static_cast<size_t>(n * cols));
    auto d_x = Upload(x);
    auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
    TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVec(w.gpu(), d_x.get(), cols, n, d_y.get(), rows, nullptr));
    std::vector<float> want(static_cast<size_t>(n * rows));
    MatMul(w.view(), x.data(), n, want.data(), nullptr);
    const double err = gpu_testing::LogError("matvec_n" + std::to_string(n), RelL2(Download(d_y), want));
    EXPECT_LE(err, 1e-5) << "n=" << n;
  }
}

// Shapes that reach every branch of the decode kernels: rows shorter than 32 pieces (fewer lanes
// per row), rows that end mid-way through a warp's pieces, odd row counts that end mid-way
// through a block's row group, padded activation and output strides, every row count 1..8, and
// (for the 2-byte aligned Q8_0 and Q6_K) a matrix at a 2-byte offset, whose rows alternate
// between 4-byte aligned and not.
TEST_P(GpuDenseTest, MatVecMatchesReferenceOnEdgeShapes) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const WeightType type = GetParam();
  const bool two_byte_aligned = type == WeightType::kQ8_0 || type == WeightType::kQ6_K;
  struct Shape {
    int64_t cols, rows, offset;
  };
  std::vector<Shape> shapes = {{256, 37, 0}, {512, 129, 0}, {2304, 29, 0}};
  if (type == WeightType::kQ8_0) shapes.push_back({96, 33, 0});
  if (two_byte_aligned) {
    shapes.push_back({256, 41, 2});
    shapes.push_back({2304, 7, 2});
  }
  for (const Shape& sh : shapes) {
    const gpu_testing::TestMatrix w = RandomMatrix(rng, type, sh.cols, sh.rows, 0.05f);
    // The device copy at byte offset sh.offset of a larger allocation.
    auto shifted = gpu_testing::Alloc<uint8_t>(w.bytes.size() + 16);
    ASSERT_EQ(cudaMemcpy(shifted.get() + sh.offset, w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    cuda::DeviceMatrix m = w.gpu();
    m.data = shifted.get() + sh.offset;
    const int64_t x_stride = sh.cols + 4, y_stride = sh.rows + 3;
    for (int n = 1; n <= cuda::kMatVecMaxRows; ++n) {
      const std::vector<float> x = Random(rng, static_cast<size_t>(n * x_stride));
      auto d_x = Upload(x);
      auto d_y = Poisoned<float>(static_cast<size_t>(n * y_stride));
      TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVec(m, d_x.get(), x_stride, n, d_y.get(), y_stride, nullptr));
      std::vector<float> want(static_cast<size_t>(n * sh.rows));
      std::vector<float> xs(static_cast<size_t>(n * sh.cols));
      for (int t = 0; t < n; ++t) std::memcpy(&xs[t * sh.cols], &x[t * x_stride], sh.cols * sizeof(float));
      MatMul(w.view(), xs.data(), n, want.data(), nullptr);
      const std::vector<float> y = Download(d_y);
      std::vector<float> got(want.size());
      for (int t = 0; t < n; ++t) {
        std::memcpy(&got[t * sh.rows], &y[t * y_stride], sh.rows * sizeof(float));
        // The padding between output rows stays untouched (poison: NaN bits).
        for (int64_t i = sh.rows; i < y_stride; ++i) EXPECT_TRUE(std::isnan(y[t * y_stride + i])) << "t=" << t;
      }
      const std::string what = "matvec_edge_c" + std::to_string(sh.cols) + "_r" + std::to_string(sh.rows) + "_o" +
                               std::to_string(sh.offset) + "_n" + std::to_string(n);
      EXPECT_LE(gpu_testing::LogError(what, RelL2(got, want)), 1e-5) << what;
    }
  }
}

// Every kernel choice and forced split of the streaming kernel (matvec_stream.cuh), on: a matrix
// with a padded row stride at an offset (the 2-byte aligned Q8_0 and Q6_K: rows alternate
// between 4-byte aligned and not; the padding holds NaN bytes, which must never be read) and
// enough rows that blocks walk several row groups (blocks_per_sm = 1); 4096 columns, whose 8
// activation rows exceed one block's shared memory (grid.y chunks); and rows too wide for the
// streaming kernel (the previous dispatch takes them).
TEST_P(GpuDenseTest, MatVecKernelChoicesMatchReference) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const WeightType type = GetParam();
  const int64_t align = cuda::KernelRowAlignment(static_cast<uint32_t>(type));
  struct Case {
    int64_t cols, rows, pad, offset;
  };
  // {2048, 5001, 16, 0}: a 16-byte padded stride, as the staged Q6_K kernel takes (kStaged), with
  // enough rows that its warps walk several row groups at blocks_per_sm = 1.
  const Case cases[] = {{2048, 1031, align, align}, {4096, 67, 0, 0}, {20480, 5, 0, 0}, {2048, 5001, 16, 0}};
  struct Choice {
    const char* name;
    cuda::MatVecOptions options;
  };
  using K = cuda::MatVecKernel;
  const Choice choices[] = {{"auto", {K::kAuto, 0, 0}},      {"previous", {K::kPrevious, 0, 0}},
                            {"generic", {K::kGeneric, 0, 0}}, {"wpr1_b1", {K::kAuto, 1, 1}},
                            {"wpr2_b1", {K::kAuto, 2, 1}},    {"wpr4_b1", {K::kAuto, 4, 1}},
                            {"wpr8_b1", {K::kAuto, 8, 1}},    {"wpr8_b9", {K::kAuto, 8, 9}},
                            {"auto_b1", {K::kAuto, 0, 1}},    {"staged", {K::kStaged, 0, 0}},
                            {"staged_b1", {K::kStaged, 0, 1}}, {"head", {K::kQ6Head, 0, 0}},
                            {"head_b1", {K::kQ6Head, 0, 1}},   {"head_v1_b1", {K::kQ6Head, 0, 1, 1}},
                            {"head_v3_b1", {K::kQ6Head, 0, 1, 3}}};
  for (const Case& c : cases) {
    const gpu_testing::TestMatrix w = RandomMatrix(rng, type, c.cols, c.rows, 0.05f);
    const int64_t row_bytes = w.row_bytes + c.pad;
    std::vector<uint8_t> padded(static_cast<size_t>(c.offset + row_bytes * c.rows + 16), 0xFF);
    for (int64_t r = 0; r < c.rows; ++r) {
      std::memcpy(&padded[c.offset + r * row_bytes], &w.bytes[r * w.row_bytes], w.row_bytes);
    }
    auto d_padded = Upload(padded);
    const cuda::DeviceMatrix m{static_cast<uint32_t>(type), d_padded.get() + c.offset, c.cols, c.rows, row_bytes};
    for (int n : {1, 3, 8}) {
      const std::vector<float> x = Random(rng, static_cast<size_t>(n * c.cols));
      auto d_x = Upload(x);
      std::vector<float> want(static_cast<size_t>(n * c.rows));
      MatMul(w.view(), x.data(), n, want.data(), nullptr);
      for (const Choice& ch : choices) {
        auto d_y = Poisoned<float>(static_cast<size_t>(n * c.rows));
        TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVec(m, d_x.get(), c.cols, n, d_y.get(), c.rows, ch.options, nullptr));
        const std::string what = std::string("matvec_") + ch.name + "_c" + std::to_string(c.cols) + "_r" +
                                 std::to_string(c.rows) + "_pad" + std::to_string(c.pad) + "_n" + std::to_string(n);
        EXPECT_LE(gpu_testing::LogError(what, RelL2(Download(d_y), want)), 1e-5) << what;
      }
    }
  }
  // Bad tuning values are refused.
  auto d_x = Poisoned<float>(256);
  auto d_y = Poisoned<float>(4);
  const gpu_testing::TestMatrix w = RandomMatrix(rng, type, 256, 4);
  EXPECT_EQ(cuda::LaunchDenseMatVec(w.gpu(), d_x.get(), 256, 1, d_y.get(), 4, {K::kAuto, 3, 0}, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchDenseMatVec(w.gpu(), d_x.get(), 256, 1, d_y.get(), 4, {K::kAuto, 0, -1}, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchDenseMatVec(w.gpu(), d_x.get(), 256, 1, d_y.get(), 4, {K::kQ6Head, 0, 0, -1}, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchDenseMatVec(w.gpu(), d_x.get(), 256, 1, d_y.get(), 4, {K::kQ6Head, 0, 0, 99}, nullptr),
            cudaErrorInvalidValue);
}

TEST_P(GpuDenseTest, GemmExactAndFastMatchReference) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t cols = 512, rows = 333, n = 45;
  const gpu_testing::TestMatrix w = RandomMatrix(rng, GetParam(), cols, rows, 0.05f);
  const std::vector<float> x = Random(rng, static_cast<size_t>(n * cols));
  std::vector<float> want(static_cast<size_t>(n * rows));
  MatMul(w.view(), x.data(), n, want.data(), nullptr);
  auto d_x = Upload(x);
  for (cuda::GemmMode mode : {cuda::GemmMode::kExact, cuda::GemmMode::kFast, cuda::GemmMode::kFastSplit}) {
    const cuda::DenseGemmOptions options = gpu_testing::SmallGemmOptions(mode, cols);
    auto gemm = cuda::DenseGemm::Create(options);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
    ASSERT_TRUE((*gemm)->Run(w.gpu(), d_x.get(), n, d_y.get(), nullptr).ok());
    const char* name = mode == cuda::GemmMode::kExact  ? "gemm_exact"
                       : mode == cuda::GemmMode::kFast ? "gemm_fast_f16"
                                                       : "gemm_fast_f16_split";
    const double err = gpu_testing::LogError(name, RelL2(Download(d_y), want));
    // The split keeps ~22 bits of both operands: close to f32, far below one f16 product's error.
    EXPECT_LE(err, mode == cuda::GemmMode::kFast ? 1e-2 : mode == cuda::GemmMode::kFastSplit ? 2e-5 : 1e-5) << name;
  }
}

// The prepared copies (DenseGemm::Prepare): kFast ([hi]), kFastSplit as one product ([hi | lo | hi])
// and as two ([hi | lo]); a split copy also serves kFast Runs, a kFast copy does not serve
// kFastSplit ones (they dequantize tile by tile) until it is prepared again; kExact Runs never
// read a copy. 320 rows of 512 columns at a 2-byte offset for the 2-byte aligned types.
TEST_P(GpuDenseTest, GemmPreparedMatchesReference) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const WeightType type = GetParam();
  const int64_t cols = 512, rows = 320, n = 45;
  const gpu_testing::TestMatrix w = RandomMatrix(rng, type, cols, rows, 0.05f);
  const int64_t offset = cuda::KernelRowAlignment(static_cast<uint32_t>(type)) == 2 ? 2 : 0;
  auto shifted = gpu_testing::Alloc<uint8_t>(w.bytes.size() + 16);
  ASSERT_EQ(cudaMemcpy(shifted.get() + offset, w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  cuda::DeviceMatrix m = w.gpu();
  m.data = shifted.get() + offset;
  const std::vector<float> x = Random(rng, static_cast<size_t>(n * cols));
  std::vector<float> want(static_cast<size_t>(n * rows));
  MatMul(w.view(), x.data(), n, want.data(), nullptr);
  auto d_x = Upload(x);
  using cuda::GemmMode;
  for (bool one_product : {true, false}) {
    for (GemmMode plan : {GemmMode::kFast, GemmMode::kFastSplit}) {
      cuda::DenseGemmOptions options = gpu_testing::SmallGemmOptions(plan, cols);
      options.split_one_product = one_product;
      auto gemm = cuda::DenseGemm::Create(options);
      ASSERT_TRUE(gemm.ok()) << gemm.status();
      cuda::DenseGemm& g = **gemm;
      ASSERT_TRUE(g.Prepare(m).ok());
      ASSERT_TRUE(g.Prepare(m).ok());  // again: a no-op
      EXPECT_EQ(g.prepared_bytes(), cuda::DenseGemm::PreparedBytes(m, plan, options));
      EXPECT_TRUE(g.IsPrepared(m, GemmMode::kFast));
      EXPECT_EQ(g.IsPrepared(m, GemmMode::kFastSplit), plan == GemmMode::kFastSplit);
      EXPECT_FALSE(g.IsPrepared(m, GemmMode::kExact));
      for (GemmMode mode : {GemmMode::kFast, GemmMode::kFastSplit, GemmMode::kExact}) {
        auto d_y = Poisoned<float>(static_cast<size_t>(n * rows));
        ASSERT_TRUE(g.Run(m, d_x.get(), n, d_y.get(), nullptr, mode).ok());
        const std::string name = std::string("gemm_prepared_") + (one_product ? "one_" : "two_") +
                                 (plan == GemmMode::kFast ? "fastplan_" : "splitplan_") +
                                 (mode == GemmMode::kFast ? "fast" : mode == GemmMode::kFastSplit ? "split" : "exact");
        const double err = gpu_testing::LogError(name, RelL2(Download(d_y), want));
        EXPECT_LE(err, mode == GemmMode::kFast ? 1e-2 : mode == GemmMode::kFastSplit ? 2e-5 : 1e-5) << name;
      }
      // A kFast copy upgraded to a split one replaces it.
      ASSERT_TRUE(g.Prepare(m, GemmMode::kFastSplit).ok());
      EXPECT_TRUE(g.IsPrepared(m, GemmMode::kFastSplit));
      EXPECT_EQ(g.prepared_bytes(), cuda::DenseGemm::PreparedBytes(m, GemmMode::kFastSplit, options));
      // Same pointer, another shape: not the prepared matrix (tiled path), still right.
      cuda::DeviceMatrix fewer = m;
      fewer.rows = rows - 1;
      EXPECT_FALSE(g.IsPrepared(fewer, GemmMode::kFast));
    }
  }
  // A kExact plan has no f16 copies to make.
  const cuda::DenseGemmOptions exact = gpu_testing::SmallGemmOptions(GemmMode::kExact, cols);
  auto g = cuda::DenseGemm::Create(exact);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE((*g)->Prepare(m).ok());
  EXPECT_EQ((*g)->prepared_bytes(), 0);
  EXPECT_EQ((*g)->Prepare(m, GemmMode::kFast).code(), absl::StatusCode::kInvalidArgument);
}

// Stacked prepared copies (DenseGemm::PrepareStack) and activations converted once
// (ConvertInput / RunInput): three matrices of different rows and scales as one copy, one product
// giving all three outputs side by side (zero padding columns), each part still runnable on its
// own from the stack (RunInput and the f32 Run); the same accuracy as the separate copies: 2e-5
// relative L2 for the split, 1e-2 for the single f16 product.
TEST_P(GpuDenseTest, GemmStackAndConvertedInputMatchReference) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  using cuda::GemmMode;
  const WeightType type = GetParam();
  const int64_t cols = 512, n = 45;
  const int64_t part_rows[3] = {200, 136, 1};
  const float stddev[3] = {0.05f, 0.02f, 0.3f};  // different maxima: one shared scale for all
  std::vector<gpu_testing::TestMatrix> w;
  for (int i = 0; i < 3; ++i) w.push_back(RandomMatrix(rng, type, cols, part_rows[i], stddev[i]));
  const cuda::DeviceMatrix m[3] = {w[0].gpu(), w[1].gpu(), w[2].gpu()};
  const cuda::DeviceMatrix* parts[3] = {&m[0], &m[1], &m[2]};
  const std::vector<float> x = Random(rng, static_cast<size_t>(n * cols));
  auto d_x = Upload(x);
  std::vector<std::vector<float>> want(3);
  for (int i = 0; i < 3; ++i) {
    want[i].resize(static_cast<size_t>(n * part_rows[i]));
    MatMul(w[i].view(), x.data(), n, want[i].data(), nullptr);
  }
  const cuda::DenseGemmOptions options = gpu_testing::SmallGemmOptions(GemmMode::kFastSplit, cols);
  auto gemm = cuda::DenseGemm::Create(options);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  cuda::DenseGemm& g = **gemm;
  absl::StatusOr<int64_t> stack_rows = g.PrepareStack(parts, GemmMode::kFastSplit);
  ASSERT_TRUE(stack_rows.ok()) << stack_rows.status();
  const int64_t R = *stack_rows;
  EXPECT_EQ(R, 344);  // 337 rows padded to a multiple of 8
  EXPECT_EQ(g.StackRows(parts), R);
  EXPECT_EQ(g.StackRows(std::span<const cuda::DeviceMatrix* const>(parts, 2)), R);  // a prefix is the same stack
  EXPECT_EQ(g.StackRows(std::span<const cuda::DeviceMatrix* const>(parts + 1, 2)), 0);
  EXPECT_EQ(g.prepared_bytes(), R * cols * 2 * 3);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(g.IsPrepared(m[i], GemmMode::kFastSplit));
  // Again: the parts are prepared already (nothing changes); a single Prepare is a no-op.
  EXPECT_EQ(g.PrepareStack(parts, GemmMode::kFastSplit).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(g.Prepare(m[1], GemmMode::kFastSplit).ok());
  EXPECT_EQ(g.prepared_bytes(), R * cols * 2 * 3);
  for (GemmMode mode : {GemmMode::kFastSplit, GemmMode::kFast}) {
    const double tol = mode == GemmMode::kFast ? 1e-2 : 2e-5;
    const std::string tag = mode == GemmMode::kFast ? "fast" : "split";
    absl::StatusOr<cuda::DenseGemm::F16Input> in = g.ConvertInput(d_x.get(), n, cols, mode, nullptr);
    ASSERT_TRUE(in.ok()) << in.status();
    auto d_y = Poisoned<float>(static_cast<size_t>(n * R));
    ASSERT_TRUE(g.RunStack(parts, *in, d_y.get(), nullptr).ok());
    const std::vector<float> y = Download(d_y);
    int64_t col = 0;
    for (int i = 0; i < 3; ++i) {
      std::vector<float> got(static_cast<size_t>(n * part_rows[i]));
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < part_rows[i]; ++r) got[t * part_rows[i] + r] = y[t * R + col + r];
      }
      const std::string name = "gemm_stack_" + tag + "_part" + std::to_string(i);
      EXPECT_LE(gpu_testing::LogError(name, RelL2(got, want[i])), tol) << name;
      col += part_rows[i];
    }
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = col; r < R; ++r) ASSERT_EQ(y[t * R + r], 0.0f) << "padding column " << r;
    }
    // Each part on its own from the same converted input, and through the f32 entry point.
    for (int i = 0; i < 3; ++i) {
      auto d_part = Poisoned<float>(static_cast<size_t>(n * part_rows[i]));
      ASSERT_TRUE(g.RunInput(m[i], *in, d_part.get(), nullptr).ok());
      const std::string name = "gemm_converted_input_" + tag + "_part" + std::to_string(i);
      EXPECT_LE(gpu_testing::LogError(name, RelL2(Download(d_part), want[i])), tol) << name;
      auto d_f32 = Poisoned<float>(static_cast<size_t>(n * part_rows[i]));
      ASSERT_TRUE(g.Run(m[i], d_x.get(), n, d_f32.get(), nullptr, mode).ok());
      EXPECT_EQ(Download(d_f32), Download(d_part)) << "Run and RunInput differ, part " << i;
    }
  }
  // Refusals: an unprepared matrix, a wrongly sized input, parts not stacked in this order.
  const gpu_testing::TestMatrix other = RandomMatrix(rng, type, cols, 8, 0.05f);
  absl::StatusOr<cuda::DenseGemm::F16Input> in = g.ConvertInput(d_x.get(), n, cols, GemmMode::kFastSplit, nullptr);
  ASSERT_TRUE(in.ok());
  auto d_y = Poisoned<float>(static_cast<size_t>(n * R));
  EXPECT_EQ(g.RunInput(other.gpu(), *in, d_y.get(), nullptr).code(), absl::StatusCode::kFailedPrecondition);
  cuda::DenseGemm::F16Input wrong = *in;
  wrong.cols = cols / 2;
  EXPECT_EQ(g.RunInput(m[0], wrong, d_y.get(), nullptr).code(), absl::StatusCode::kInvalidArgument);
  const cuda::DeviceMatrix* swapped[2] = {&m[1], &m[0]};
  EXPECT_EQ(g.RunStack(swapped, *in, d_y.get(), nullptr).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(g.ConvertInput(d_x.get(), 65, cols, GemmMode::kFastSplit, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Scales more than 2^12 apart are not stacked (f32 weights: any magnitude is representable).
  if (type == WeightType::kF32) {
    const gpu_testing::TestMatrix big = RandomMatrix(rng, type, cols, 16, 1.0f);
    const gpu_testing::TestMatrix tiny = RandomMatrix(rng, type, cols, 16, 1e-5f);
    const cuda::DeviceMatrix b = big.gpu(), t = tiny.gpu();
    const cuda::DeviceMatrix* far[2] = {&b, &t};
    const int64_t before = g.prepared_bytes();
    EXPECT_EQ(g.PrepareStack(far, GemmMode::kFastSplit).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(g.prepared_bytes(), before);
    EXPECT_FALSE(g.IsPrepared(b, GemmMode::kFast));
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, GpuDenseTest, ::testing::ValuesIn(gpu_testing::GpuTypes()), TypeName);

}  // namespace
}  // namespace tandem
