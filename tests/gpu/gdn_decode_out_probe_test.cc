// The fused GDN kernel's in-step stamps (kernels/gdn_decode_out_probe.h): with the probe switch on
// and a buffer armed, one launch of LaunchGdnDecodeFusedOut (the 80B layer's shape, its output rows
// by columns through bulk copies) stamps every block once, each block's stamps in the order its
// thread 0 passes them, with its SM and its cluster (the key head group, vh / (nv/nk)); the stamps
// change nothing (the gated outputs and the whole state buffer are the same bits as an unstamped
// launch's); and with the buffer disarmed a stamped launch writes no more stamps.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_out_probe.h"
#include "gtest/gtest.h"
#include "tests/armed_probe_check.h"
#include "tests/gpu/gdn_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::Upload;

TEST(GpuGdnDecodeOutProbeTest, StampsEveryBlockOnceInOrderAndChangesNothing) {
  TANDEM_SKIP_WITHOUT_GPU();
  const cuda::GdnShape d{16, 32, 128, 128, 4};  // Qwen3-Next-80B's GDN layer
  constexpr int64_t kOutRows = 2048;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t c_dim = d.c_dim(), vw = static_cast<int64_t>(d.nv) * d.dv;
  const int64_t in_rows = vw + c_dim + 2 * d.nv;  // the stacked [z; qkv; ba] rows
  const gdn_testing::StateLayout layout = gdn_testing::StateLayoutOf(d);
  const gdn_testing::GdnParams params = gdn_testing::RandomGdnParams(rng, d);
  const std::vector<float> state0 = Random(rng, static_cast<size_t>(layout.row_stride), 0.3f);
  const auto seq_rows = Upload(std::vector<int32_t>{0});
  auto rows = Upload(Random(rng, static_cast<size_t>(in_rows)));
  const gpu_testing::Regrouped out_dev =
      gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, vw, kOutRows, 0.05f));
  auto by_columns = Poisoned<uint8_t>(static_cast<size_t>(cuda::Q8_0x8ByColumnsBytes(kOutRows, vw)));
  TANDEM_ASSERT_CUDA(cuda::CopyQ8_0x8ByColumns(out_dev.m, by_columns.get(), nullptr, kOutRows));

  struct Result {
    std::vector<float> gated, rec;
  };
  auto run = [&]() -> Result {
    auto rec = Upload(state0);
    auto y = Upload(std::vector<float>(static_cast<size_t>(kOutRows), 0.0f));
    auto gated = Poisoned<float>(static_cast<size_t>(vw));
    cuda::GdnDecodeFusedArgs args = gdn_testing::ReadingStackedRows(
        gdn_testing::OneTokenArgs(params, layout.row_stride, seq_rows.get()), rows.get(), d);
    args.history = rec.get();
    args.state = rec.get() + layout.ssm_off;
    args.o = gated.get();
    EXPECT_EQ(cuda::LaunchGdnDecodeFusedOut(args, out_dev.m, y.get(), d, nullptr, by_columns.get()), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return {Download(gated), Download(rec)};
  };

  const bool was_bulk = cuda::GdnOutBulk();
  cuda::SetGdnOutBulk(true);
  const Result want = run();
  // Room for two launches' rows: the second half must stay zero.
  const int grid = d.nv * (d.dv / 32);
  const unsigned capacity = 2 * static_cast<unsigned>(grid);
  absl::StatusOr<cuda::DeviceBuffer> stamps =
      cuda::DeviceBuffer::Allocate(size_t{capacity} * cuda::kGdnOutProbeWords * sizeof(unsigned long long));
  ASSERT_TRUE(stamps.ok()) << stamps.status();
  auto* dev_stamps = stamps->as<unsigned long long>();
  TANDEM_ASSERT_CUDA(cudaMemset(dev_stamps, 0, size_t{capacity} * cuda::kGdnOutProbeWords * 8));
  TANDEM_ASSERT_CUDA(cuda::SetGdnOutProbe(dev_stamps, capacity, nullptr));
  Result got, after;
  {
    const ::tandem::testing::ScopedProbeDecodeStep probed(true);
    got = run();
    // Disarmed (no buffer), the stamped launch writes nothing more.
    TANDEM_ASSERT_CUDA(cuda::SetGdnOutProbe(nullptr, 0, nullptr));
    after = run();
  }
  cuda::SetGdnOutBulk(was_bulk);

  EXPECT_TRUE(gpu_testing::SameBits(got.gated, want.gated))
      << "gated outputs differ from " << gpu_testing::FirstDifference(got.gated, want.gated);
  EXPECT_TRUE(gpu_testing::SameBits(got.rec, want.rec))
      << "state buffer differs from float " << gpu_testing::FirstDifference(got.rec, want.rec);
  EXPECT_TRUE(gpu_testing::SameBits(after.gated, want.gated));

  std::vector<unsigned long long> h(size_t{capacity} * cuda::kGdnOutProbeWords);
  TANDEM_ASSERT_CUDA(cudaMemcpy(h.data(), dev_stamps, h.size() * 8, cudaMemcpyDeviceToHost));
  int sms = 0;
  TANDEM_ASSERT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const unsigned long long r = static_cast<unsigned long long>(d.nv / d.nk);
  ::tandem::testing::ExpectEveryBlockOnce(
      h, cuda::kGdnOutProbeWords, grid,
      [](const unsigned long long* row) { return row[cuda::kGdnOutProbeBlock] & 0xFFFF; },
      [&](int b, const unsigned long long* row) {
        for (int p = 0; p < cuda::kGdnOutProbeStamps; ++p) {
          EXPECT_NE(row[p], 0ull) << "block " << b << " stamp " << p;
          if (p > 0) {
            EXPECT_LE(row[p - 1], row[p]) << "block " << b << " stamp " << p << " before the one before it";
          }
        }
        EXPECT_LT(row[cuda::kGdnOutProbeSm], static_cast<unsigned long long>(sms)) << "block " << b;
        const unsigned long long cluster = row[cuda::kGdnOutProbeBlock] >> 16;
        EXPECT_EQ(cluster, static_cast<unsigned long long>(b) % static_cast<unsigned long long>(d.nv) / r)
            << "block " << b;
      });
}

}  // namespace
}  // namespace tandem
