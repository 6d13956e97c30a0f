// The batch-1 Q6_K LM-head kernel (matvec_q6k_head.cuh) against the CPU reference and the staged
// kernel it replaced. Skips without a GPU (CI).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/reference/matmul.h"
#include "common/reference/weight_view.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Alloc;
using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RelL2;
using gpu_testing::Upload;

// rows x row_bytes of random Q6_K bytes (the first 1680 of a row; padding stays 0xFF) with small
// finite f16 scales, |d| in [2^-10, 2^-7) (quantizing a head's 311M values on the host would take
// minutes).
std::vector<uint8_t> RandomQ6Rows(std::mt19937& rng, int64_t rows, int64_t row_bytes) {
  constexpr int64_t kCols = 2048, kNatural = 1680;
  std::vector<uint8_t> bytes(static_cast<size_t>(row_bytes * rows), 0xFF);
  std::mt19937_64 bits(rng());
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = bytes.data() + r * row_bytes;
    for (int64_t i = 0; i < kNatural; i += 8) {
      const uint64_t v = bits();
      std::memcpy(row + i, &v, 8);  // kNatural % 8 == 0
    }
    for (int64_t b = 0; b < kCols / 256; ++b) {
      const uint16_t d = static_cast<uint16_t>(0x1400u | (bits() & 0x8FFFu));
      std::memcpy(row + b * 210 + 208, &d, 2);
    }
  }
  return bytes;
}

// The shapes both head tests run: the LM head's (2048 -> 151936, what kAuto sends the kernel) and
// small ones (rows not a multiple of its row groups, a 16-byte padded stride, fewer rows than warps).
struct HeadShape {
  int64_t rows, pad;
};
constexpr HeadShape kHeadShapes[] = {{151936, 0}, {1001, 16}, {37, 0}, {5, 16}};
constexpr int64_t kHeadCols = 2048;

// A random Q6_K matrix of a head shape (RandomQ6Rows), its bytes on the host and the device.
struct Q6Matrix {
  int64_t rows, row_bytes;
  std::vector<uint8_t> bytes;
  gpu_testing::DeviceArray<uint8_t> dev;
  cuda::DeviceMatrix device() const {
    return {static_cast<uint32_t>(WeightType::kQ6_K), dev.get(), kHeadCols, rows, row_bytes};
  }
  MatrixView host() const { return {WeightType::kQ6_K, bytes.data(), kHeadCols, rows, row_bytes}; }
};
Q6Matrix MakeQ6Matrix(std::mt19937& rng, const HeadShape& shape) {
  Q6Matrix q{shape.rows, 1680 + shape.pad, {}, {}};
  q.bytes = RandomQ6Rows(rng, q.rows, q.row_bytes);
  q.dev = Upload(q.bytes);
  return q;
}

// One head shape's random matrix, a random activation row (`edit` may change it first) on the host
// and the device, the CPU reference's product, and launches of the kernels on them.
struct HeadCase {
  HeadShape shape;
  Q6Matrix q;
  std::vector<float> x, want;
  gpu_testing::DeviceArray<float> d_x;
  // y through LaunchDenseMatVec with options o (x_dev: another device row of kHeadCols, else d_x).
  std::vector<float> Run(const cuda::MatVecOptions& o, const float* x_dev = nullptr) const {
    auto d_y = Poisoned<float>(static_cast<size_t>(shape.rows));
    EXPECT_EQ(cuda::LaunchDenseMatVec(q.device(), x_dev != nullptr ? x_dev : d_x.get(), kHeadCols, 1, d_y.get(),
                                      shape.rows, o, nullptr),
              cudaSuccess);
    return Download(d_y);
  }
  std::string Name() const { return "_r" + std::to_string(shape.rows) + "_pad" + std::to_string(shape.pad); }
};
HeadCase MakeHeadCase(std::mt19937& rng, const HeadShape& shape,
                      const std::function<void(std::vector<float>&)>& edit = nullptr) {
  HeadCase c{shape, MakeQ6Matrix(rng, shape), Random(rng, static_cast<size_t>(kHeadCols)), {}, {}};
  if (edit) edit(c.x);
  c.d_x = Upload(c.x);
  c.want.resize(static_cast<size_t>(shape.rows));
  MatMul(c.q.host(), c.x.data(), 1, c.want.data(), nullptr);
  return c;
}

// The one-row Q6_K head kernel (matvec_q6k_head.cuh, MatVecKernel::kQ6Head) at the LM head's shape
// (2048 -> 151936, what kAuto sends it) and at small ones (rows not a multiple of its row groups,
// a 16-byte padded stride, fewer rows than warps): every compiled variant, its default grid and
// one block per SM (several row groups a warp), against the CPU reference and bit for bit against
// the staged kernel it replaces (same sums in the same order); kAuto at the head shape too. The
// head-sized matrix is random Q6_K bytes with small finite f16 scales (quantizing 311M values on
// the host would take minutes).
TEST(GpuQ6Head, MatchesReferenceAndStagedBits) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  using K = cuda::MatVecKernel;
  for (const HeadShape c : kHeadShapes) {
    const HeadCase hc = MakeHeadCase(rng, c);
    const std::vector<float>& want = hc.want;
    auto run = [&](const cuda::MatVecOptions& o) { return hc.Run(o); };
    const std::vector<float> staged = run({K::kStaged, 0, 0});
    const std::string shape = hc.Name();
    EXPECT_LE(gpu_testing::LogError("q6head_staged" + shape, RelL2(staged, want)), 1e-5);
    std::vector<std::pair<std::string, cuda::MatVecOptions>> runs;
    for (int v = 0; v < cuda::kMatVecHeadVariants; ++v) {
      const std::string name = std::string("v") + std::to_string(v);
      runs.push_back({name, {K::kQ6Head, 0, 0, v}});
      runs.push_back({name + "_b1", {K::kQ6Head, 0, 1, v}});
    }
    if (c.rows == 151936) runs.push_back({"auto", {K::kAuto, 0, 0}});
    for (const auto& [name, o] : runs) {
      const std::vector<float> got = run(o);
      const std::string what = "q6head_" + name + shape;
      EXPECT_LE(gpu_testing::LogError(what, RelL2(got, want)), 1e-5) << what;
      ASSERT_EQ(got.size(), staged.size());
      EXPECT_EQ(std::memcmp(got.data(), staged.data(), got.size() * sizeof(float)), 0)
          << what << ": not the staged kernel's bits";
    }
  }
}

// MatVecOptions::y_at: the head kernel writes to the destination a device slot holds (set after a
// graph would have captured the launch), device memory or a page-locked host row through its
// mapped address, with the bits of a plain launch, and leaves y alone; y_at is refused where the
// head kernel does not run (another kernel choice, another shape).
TEST(GpuQ6Head, WritesWhereTheDestinationSlotPoints) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  using K = cuda::MatVecKernel;
  const int64_t cols = 2048, rows = 4099, row_bytes = 1680;
  const std::vector<uint8_t> bytes = RandomQ6Rows(rng, rows, row_bytes);
  auto d_w = Upload(bytes);
  const cuda::DeviceMatrix m{static_cast<uint32_t>(WeightType::kQ6_K), d_w.get(), cols, rows, row_bytes};
  ASSERT_TRUE(cuda::DenseMatVecQ6HeadTakes(m, 1));
  EXPECT_FALSE(cuda::DenseMatVecQ6HeadTakes(m, 2));
  auto d_x = Upload(Random(rng, static_cast<size_t>(cols)));
  auto d_plain = Poisoned<float>(static_cast<size_t>(rows));
  TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVec(m, d_x.get(), cols, 1, d_plain.get(), rows, {K::kQ6Head}, nullptr));
  const std::vector<float> plain = Download(d_plain);

  auto host = cuda::PinnedBuffer::Allocate(static_cast<size_t>(rows) * sizeof(float));
  ASSERT_TRUE(host.ok()) << host.status();
  std::memset(host->get(), 0xFF, host->bytes());
  void* mapped = nullptr;
  TANDEM_ASSERT_CUDA(cudaHostGetDevicePointer(&mapped, host->get(), 0));
  auto d_other = Poisoned<float>(static_cast<size_t>(rows));
  auto slot = Alloc<float*>(1);
  for (float* dest : {d_other.get(), static_cast<float*>(mapped)}) {
    const bool to_host = dest != d_other.get();
    TANDEM_ASSERT_CUDA(cudaMemcpy(slot.get(), &dest, sizeof(dest), cudaMemcpyHostToDevice));
    auto d_y = Poisoned<float>(static_cast<size_t>(rows));
    cuda::MatVecOptions o;
    o.kernel = K::kQ6Head;
    o.y_at = slot.get();
    TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVec(m, d_x.get(), cols, 1, d_y.get(), rows, o, nullptr));
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<float> got(static_cast<size_t>(rows));
    if (to_host) {
      std::memcpy(got.data(), host->get(), got.size() * sizeof(float));
    } else {
      got = Download(d_other);
    }
    EXPECT_EQ(std::memcmp(got.data(), plain.data(), got.size() * sizeof(float)), 0)
        << (to_host ? "host row" : "device row") << ": not a plain launch's bits";
    const std::vector<float> untouched = Download(d_y);
    const uint32_t poison = 0xFFFFFFFFu;
    for (float v : untouched) {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      ASSERT_EQ(u, poison) << "y was written although y_at was set";
    }
  }
  // Refusals: y_at asks for the head kernel by name, at a product it takes.
  auto d_y = Poisoned<float>(static_cast<size_t>(rows));
  cuda::MatVecOptions o;
  o.y_at = slot.get();
  for (K k : {K::kAuto, K::kStaged, K::kStream}) {
    o.kernel = k;
    EXPECT_EQ(cuda::LaunchDenseMatVec(m, d_x.get(), cols, 1, d_y.get(), rows, o, nullptr), cudaErrorInvalidValue);
  }
  o.kernel = K::kQ6Head;
  auto d_x2 = Upload(Random(rng, static_cast<size_t>(2 * cols)));
  EXPECT_EQ(cuda::LaunchDenseMatVec(m, d_x2.get(), cols, 2, d_y.get(), rows, o, nullptr), cudaErrorInvalidValue);
  const cuda::DeviceMatrix narrow{static_cast<uint32_t>(WeightType::kQ6_K), d_w.get(), 1024, rows, row_bytes};
  EXPECT_FALSE(cuda::DenseMatVecQ6HeadTakes(narrow, 1));
  EXPECT_EQ(cuda::LaunchDenseMatVec(narrow, d_x.get(), 1024, 1, d_y.get(), rows, o, nullptr), cudaErrorInvalidValue);
}

// The head kernel's int16 form (MatVecOptions::int16_x, the fast mode's head): every variant and
// grid at the shapes above, each row within the bound of x's rounding (a lane rounds its 64
// columns to int16 steps of max |x| / 32767: |error| <= Σ|w| · step / 2, plus f32 slack), not the
// f32 form's bits (so the form ran), a lane's piece of x all zeros exact; NaN rows from a NaN in
// x; refused where the head kernel does not run.
TEST(GpuQ6Head, Int16FormWithinXRoundingOfReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  using K = cuda::MatVecKernel;
  // Lane P's 64 columns: block P / 4, half (P / 2) % 2, 16 columns at 16 · (P % 2) + 32 g.
  auto lane_col = [](int P, int k) { return 256 * (P / 4) + 128 * ((P / 2) % 2) + 16 * (P % 2) + 32 * (k / 16) + k % 16; };
  for (const HeadShape c : kHeadShapes) {
    const HeadCase hc = MakeHeadCase(rng, c, [&](std::vector<float>& x) {
      for (int k = 0; k < 64; ++k) x[static_cast<size_t>(lane_col(5, k))] = 0.0f;  // lane 5's piece all zeros
    });
    const int64_t cols = kHeadCols;
    const cuda::DeviceMatrix m = hc.q.device();
    const MatrixView view = hc.q.host();
    const std::vector<float>& x = hc.x;
    const std::vector<float>& want = hc.want;
    std::vector<double> step(static_cast<size_t>(cols));
    for (int P = 0; P < 32; ++P) {
      float amax = 0.0f;
      for (int k = 0; k < 64; ++k) amax = std::max(amax, std::fabs(x[static_cast<size_t>(lane_col(P, k))]));
      for (int k = 0; k < 64; ++k) step[static_cast<size_t>(lane_col(P, k))] = amax / 32767.0;
    }
    std::vector<double> bound(static_cast<size_t>(c.rows));
    std::vector<float> wr(static_cast<size_t>(cols));
    for (int64_t r = 0; r < c.rows; ++r) {
      DequantizeMatrixRow(view, r, wr.data());
      double rounding = 0.0, mag = 0.0;
      for (int64_t j = 0; j < cols; ++j) {
        rounding += std::fabs(wr[j]) * 0.505 * step[j];
        mag += std::fabs(static_cast<double>(wr[j]) * x[j]);
      }
      bound[r] = rounding + 1e-5 * mag + 1e-30;
    }
    const std::string shape = hc.Name();
    const std::vector<float> plain = hc.Run({K::kQ6Head});
    for (int v = 0; v < cuda::kMatVecHeadVariants; ++v) {
      for (int bps : {0, 1}) {
        cuda::MatVecOptions o{K::kQ6Head, 0, bps, v};
        o.int16_x = true;
        const std::vector<float> got = hc.Run(o);
        const std::string what = "q6head_i16_v" + std::to_string(v) + (bps ? "_b1" : "") + shape;
        ASSERT_EQ(got.size(), want.size());
        EXPECT_LE(gpu_testing::LogError(what, RelL2(got, want)), 1e-4) << what;
        int64_t over = 0, first = -1;
        for (int64_t r = 0; r < c.rows; ++r) {
          if (!(std::fabs(static_cast<double>(got[r]) - want[r]) <= bound[r])) {
            if (first < 0) first = r;
            ++over;
          }
        }
        EXPECT_EQ(over, 0) << what << ": rows past x's rounding bound, the first " << first << " (got "
                           << (first >= 0 ? got[first] : 0.0f) << ", want " << (first >= 0 ? want[first] : 0.0f)
                           << ", bound " << (first >= 0 ? bound[first] : 0.0) << ")";
        EXPECT_NE(std::memcmp(got.data(), plain.data(), got.size() * sizeof(float)), 0)
            << what << ": the f32 form's bits (did the int16 form run?)";
      }
    }
    if (c.rows == 37) {
      std::vector<float> bad = x;
      bad[1000] = std::nanf("");
      auto d_bad = Upload(bad);
      cuda::MatVecOptions o{K::kQ6Head};
      o.int16_x = true;
      for (float y : hc.Run(o, d_bad.get())) EXPECT_TRUE(std::isnan(y)) << "a NaN in x gave a number";
      // Refused: another kernel, two activation rows.
      auto d_y = Poisoned<float>(static_cast<size_t>(2 * c.rows));
      for (K k : {K::kAuto, K::kStaged, K::kStream}) {
        o.kernel = k;
        EXPECT_EQ(cuda::LaunchDenseMatVec(m, hc.d_x.get(), cols, 1, d_y.get(), c.rows, o, nullptr), cudaErrorInvalidValue);
      }
      o.kernel = K::kQ6Head;
      auto d_x2 = Upload(Random(rng, static_cast<size_t>(2 * cols)));
      EXPECT_EQ(cuda::LaunchDenseMatVec(m, d_x2.get(), cols, 2, d_y.get(), c.rows, o, nullptr), cudaErrorInvalidValue);
    }
  }
}

}  // namespace
}  // namespace tandem
