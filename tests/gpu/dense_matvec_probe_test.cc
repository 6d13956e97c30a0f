// The stamped streaming matvec (kernels/dense_matvec_probe.h) on the batch-1 shapes it is
// benchmarked at: it writes the same bits as LaunchDenseMatVec (same kernel code, split and grid),
// with the stamps on and off, and each block's stamps are present and in phase order; the same for
// its norm-in form against LaunchDenseMatVecNormIn.
#include <cstring>
#include <vector>

#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec_probe.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Upload;

struct Shape {
  WeightType type;  // kQ8_0 is uploaded regrouped as Q8_0x8
  int64_t cols, rows;
};

// Stamps h of `capacity` slots after one probed launch of `blocks` blocks: each block in one slot of
// the first `blocks` with its SM id and every phase stamped in order; the slots past them untouched.
void ExpectEachBlockStampedOnceInOrder(const std::vector<unsigned long long>& h, unsigned capacity, int blocks,
                                       int sm_count) {
  std::vector<bool> seen(static_cast<size_t>(blocks), false);
  for (unsigned slot = 0; slot < capacity; ++slot) {
    const unsigned long long* r = h.data() + static_cast<size_t>(slot) * cuda::kStreamProbeWords;
    if (static_cast<int>(slot) >= blocks) {
      for (int i = 0; i < cuda::kStreamProbeWords; ++i) EXPECT_EQ(r[i], 0u) << "slot " << slot << " word " << i;
      continue;
    }
    const unsigned long long block = r[cuda::kStreamProbeBlock], sm = r[cuda::kStreamProbeSm];
    ASSERT_LT(block, static_cast<unsigned long long>(blocks)) << "slot " << slot;
    EXPECT_FALSE(seen[block]) << "block " << block << " twice";
    seen[block] = true;
    EXPECT_LT(sm, static_cast<unsigned long long>(sm_count));
    EXPECT_NE(r[0], 0u) << "block " << block << " entry";
    for (int p = 1; p < cuda::kStreamProbeStamps; ++p) {
      EXPECT_NE(r[p], 0u) << "block " << block << " phase " << p;  // every block has a group here
      EXPECT_GE(r[p], r[p - 1]) << "block " << block << " phase " << p;
    }
  }
}

TEST(GpuMatVecProbeTest, ProbedLaunchGivesTheSameBitsAndOrderedStamps) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  int sm_count = 0;
  TANDEM_ASSERT_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  // The stacked GDN inputs, ssm_out, the router.
  const Shape shapes[] = {{WeightType::kQ8_0, 2048, 8256}, {WeightType::kQ8_0, 4096, 2048}, {WeightType::kF32, 2048, 513}};
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(::testing::Message() << "cols " << sh.cols << " rows " << sh.rows);
    const gpu_testing::TestMatrix w = gpu_testing::RandomMatrix(rng, sh.type, sh.cols, sh.rows);
    gpu_testing::DeviceArray<uint8_t> packed;
    cuda::DeviceMatrix m = w.gpu();
    if (sh.type == WeightType::kQ8_0) {
      std::vector<uint8_t> bytes(static_cast<size_t>(cuda::Q8_0x8RowBytes(sh.cols) * sh.rows));
      cuda::RepackQ8_0x8(w.bytes.data(), w.row_bytes, sh.rows, sh.cols, bytes.data());
      packed = Upload(bytes);
      m = cuda::DeviceMatrix{cuda::kTypeQ8_0x8, packed.get(), sh.cols, sh.rows, cuda::Q8_0x8RowBytes(sh.cols)};
    }
    const auto x = Upload(gpu_testing::Random(rng, static_cast<size_t>(sh.cols)));
    auto want = Poisoned<float>(static_cast<size_t>(sh.rows));
    auto off = Poisoned<float>(static_cast<size_t>(sh.rows));
    auto got = Poisoned<float>(static_cast<size_t>(sh.rows));
    TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVec(m, x.get(), sh.cols, 1, want.get(), sh.rows, nullptr));
    cuda::StreamProbeGrid grid;
    TANDEM_ASSERT_CUDA(cuda::StreamMatVecProbeGrid(m, &grid));
    ASSERT_GE(grid.blocks, 1);
    ASSERT_GE(grid.groups, grid.blocks);
    // Stamps off, then on (two more slots than blocks: they must stay empty).
    TANDEM_ASSERT_CUDA(cuda::SetStreamMatVecProbe(nullptr, 0, nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVecProbed(m, x.get(), off.get(), nullptr));
    const unsigned capacity = static_cast<unsigned>(grid.blocks + 2);
    const size_t words = static_cast<size_t>(capacity) * cuda::kStreamProbeWords;
    auto stamps = Upload(std::vector<unsigned long long>(words, 0));
    TANDEM_ASSERT_CUDA(cuda::SetStreamMatVecProbe(stamps.get(), capacity, nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVecProbed(m, x.get(), got.get(), nullptr));
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    TANDEM_ASSERT_CUDA(cuda::SetStreamMatVecProbe(nullptr, 0, nullptr));
    const std::vector<float> a = Download(want), b = Download(off), c = Download(got);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "y bits, stamps off";
    EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0) << "y bits, stamps on";
    ExpectEachBlockStampedOnceInOrder(Download(stamps), capacity, grid.blocks, sm_count);
  }
}

// The stamped norm-in product (the GDN layers' input product in a probed decode step): the same y
// bits as LaunchDenseMatVecNormIn, H unwritten, every block stamped once with its phases in order;
// the same refusals.
TEST(GpuMatVecProbeTest, ProbedNormInLaunchGivesTheSameBitsAndOrderedStamps) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  constexpr int64_t kCols = 2048, kRows = 12352;  // the 80B's stacked [z; qkv; ba]
  const gpu_testing::TestMatrix w = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, kCols, kRows, 0.05f);
  const gpu_testing::Regrouped g = gpu_testing::Regroup(w);
  const std::vector<float> H = gpu_testing::Random(rng, kCols, 2.0f);
  auto d_H = Upload(H);
  const auto gamma = Upload(gpu_testing::Random(rng, kCols, 0.2f, 1.0f));
  const auto y_in = Upload(gpu_testing::Random(rng, kCols));
  cuda::MatVecNormIn in;
  in.H = d_H.get();
  in.y = y_in.get();
  in.gamma = gamma.get();
  in.eps = 1e-6f;
  auto want = Poisoned<float>(kRows), got = Poisoned<float>(kRows);
  TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVecNormIn(g.m, in, want.get(), nullptr));
  cuda::StreamProbeGrid grid;
  TANDEM_ASSERT_CUDA(cuda::StreamMatVecProbeGrid(g.m, &grid));
  const unsigned capacity = static_cast<unsigned>(grid.blocks + 2);
  auto stamps = Upload(std::vector<unsigned long long>(static_cast<size_t>(capacity) * cuda::kStreamProbeWords, 0));
  TANDEM_ASSERT_CUDA(cuda::SetStreamMatVecProbe(stamps.get(), capacity, nullptr));
  TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVecNormInProbed(g.m, in, got.get(), nullptr));
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  TANDEM_ASSERT_CUDA(cuda::SetStreamMatVecProbe(nullptr, 0, nullptr));
  const std::vector<float> a = Download(want), b = Download(got);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "y bits";
  EXPECT_EQ(Download(d_H), H) << "the product wrote H";
  int sm_count = 0;
  TANDEM_ASSERT_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  ExpectEachBlockStampedOnceInOrder(Download(stamps), capacity, grid.blocks, sm_count);
  EXPECT_EQ(cuda::LaunchDenseMatVecNormInProbed(w.gpu(), in, got.get(), nullptr), cudaErrorInvalidValue) << "ggml Q8_0";
  cuda::MatVecNormIn no_h = in;
  no_h.H = nullptr;
  EXPECT_EQ(cuda::LaunchDenseMatVecNormInProbed(g.m, no_h, got.get(), nullptr), cudaErrorInvalidValue);
}

// Only Q8_0x8 and F32 have a probed instantiation; other types are refused, not misread.
TEST(GpuMatVecProbeTest, RefusesOtherTypes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::TestMatrix w = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, 2048, 64);
  const auto x = Upload(std::vector<float>(2048, 1.0f));
  auto y = Poisoned<float>(64);
  cuda::StreamProbeGrid grid;
  EXPECT_EQ(cuda::StreamMatVecProbeGrid(w.gpu(), &grid), cudaErrorNotSupported);
  EXPECT_EQ(cuda::LaunchDenseMatVecProbed(w.gpu(), x.get(), y.get(), nullptr), cudaErrorNotSupported);
}

}  // namespace
}  // namespace tandem
