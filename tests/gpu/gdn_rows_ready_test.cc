// The stacked GDN input product's row counters (dense_matvec.cuh RowsReady) and the fused kernel
// with ssm_out inside that reads the rows as they are counted (gdn_decode_fused.cuh
// GdnDecodeFusedArgs::ready), against the same two launches without counters, on copies of the same
// inputs: the product's rows and the whole state buffer the same bits, the layer's output rows
// within 1e-5 (added by atomics, whose order is not fixed), and the counters at z's rows and the
// rest. Then that the kernel waits for the counts: launched first on a stream of its own, with its
// product on another stream behind a producer of the product's H that holds every SM for 200 us,
// it must still give those results (without the wait it would read the poisoned rows). Shapes: the
// 80B layer's, the small preset's, and clusters (4, 2) and (8, 1). Also what the product refuses.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec_probe.h"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gdn_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RelL2;
using gpu_testing::Upload;

struct RowsCase {
  cuda::GdnShape d;
  int64_t h;  // the stacked product's columns and ssm_out's rows
};

std::string Tag(const RowsCase& c) {
  return "nk" + std::to_string(c.d.nk) + "_nv" + std::to_string(c.d.nv) + "_dk" + std::to_string(c.d.dk) + "_dv" +
         std::to_string(c.d.dv) + "_h" + std::to_string(c.h);
}

class GpuGdnRowsReadyTest : public ::testing::TestWithParam<RowsCase> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

TEST_P(GpuGdnRowsReadyTest, CountedRowsGiveTheResultsOfTheWholeProduct) {
  const RowsCase& c = GetParam();
  const cuda::GdnShape& d = c.d;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t c_dim = d.c_dim(), vw = static_cast<int64_t>(d.nv) * d.dv;
  const int64_t in_rows = vw + c_dim + 2 * d.nv;  // [z; qkv; ba]
  const int64_t ssm_off = ((d.kk - 1) * c_dim + 3) / 4 * 4 + 4;
  const int64_t row_stride = ssm_off + static_cast<int64_t>(d.nv) * d.dk * d.dv + 12;
  const gdn_testing::GdnParams params = gdn_testing::RandomGdnParams(rng, d);
  const std::vector<float> state0 = Random(rng, static_cast<size_t>(row_stride), 0.3f);
  const auto seq_rows = Upload(std::vector<int32_t>{0});
  const gpu_testing::Regrouped in_dev =
      gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, c.h, in_rows, 0.05f));
  const gpu_testing::Regrouped out_dev =
      gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, vw, c.h, 0.05f));
  auto by_columns = Poisoned<uint8_t>(static_cast<size_t>(cuda::Q8_0x8ByColumnsBytes(c.h, vw)));
  TANDEM_ASSERT_CUDA(cuda::CopyQ8_0x8ByColumns(out_dev.m, by_columns.get(), nullptr, c.h));
  const std::vector<float> H = Random(rng, static_cast<size_t>(c.h));
  const auto d_H = Upload(H);
  const auto gamma = Upload(Random(rng, static_cast<size_t>(c.h), 0.2f, 1.0f));
  const auto y_in = Upload(Random(rng, static_cast<size_t>(c.h), 0.5f));
  const std::vector<float> y0 = Random(rng, static_cast<size_t>(c.h));
  absl::StatusOr<cuda::Stream> main = cuda::Stream::Create(), other = cuda::Stream::Create();
  ASSERT_TRUE(main.ok() && other.ok());

  // One run: the product from `H_dev` into fresh poisoned rows, the fused kernel on fresh copies
  // of the state and of y; with counters (`counted`), the kernel first on `main` and the product
  // on `other` behind the spinning producer when `late`, else both on `main` in order.
  struct Result {
    std::vector<float> rows, rec, y;
    std::vector<unsigned> counters;
  };
  auto run = [&](bool counted, bool late) -> Result {
    auto rows = Poisoned<float>(static_cast<size_t>(in_rows));
    auto rec = Upload(state0);
    auto y = Upload(y0);
    auto counters = Upload(std::vector<unsigned>{0u, 0u});
    auto H_late = Poisoned<float>(static_cast<size_t>(c.h));
    cuda::MatVecNormIn norm_in;
    norm_in.H = late ? H_late.get() : d_H.get();
    norm_in.y = y_in.get();
    norm_in.gamma = gamma.get();
    norm_in.eps = 1e-6f;
    cuda::GdnDecodeFusedArgs args;
    args.taps = params.taps.get();
    args.ssm_a = params.ssm_a.get();
    args.dt_bias = params.dt_bias.get();
    args.norm = params.norm.get();
    args.row_stride = row_stride;
    args.rows = seq_rows.get();
    args.eps = 1e-6f;
    args.history = rec.get();
    args.state = rec.get() + ssm_off;
    args.z = rows.get();
    args.qkv = rows.get() + vw;
    args.ba = rows.get() + vw + c_dim;
    args.z_stride = args.qkv_stride = args.ba_stride = in_rows;
    if (counted) {
      norm_in.ready = {counters.get(), vw, vw};
      args.ready = counters.get();
      args.ready_main = static_cast<unsigned>(in_rows - vw);
      args.ready_z = static_cast<unsigned>(vw);
    }
    Result r;
    auto gdn = [&](cudaStream_t s) {
      return cuda::LaunchGdnDecodeFusedOut(args, out_dev.m, y.get(), d, s, by_columns.get(), c.h);
    };
    if (late) {
      int sms = 0;
      EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
      EXPECT_EQ(gdn(main->get()), cudaSuccess);
      EXPECT_EQ(cuda::LaunchStreamProbeProducer(d_H.get(), H_late.get(), static_cast<int>(c.h), sms, 200'000, nullptr,
                                                other->get()),
                cudaSuccess);
      EXPECT_EQ(cuda::LaunchDenseMatVecNormIn(in_dev.m, norm_in, rows.get(), other->get()), cudaSuccess);
    } else {
      EXPECT_EQ(cuda::LaunchDenseMatVecNormIn(in_dev.m, norm_in, rows.get(), main->get()), cudaSuccess);
      EXPECT_EQ(gdn(main->get()), cudaSuccess);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    r.rows = Download(rows);
    r.rec = Download(rec);
    r.y = Download(y);
    r.counters = Download(counters);
    return r;
  };

  const bool was_bulk = cuda::GdnOutBulk();
  cuda::SetGdnOutBulk(true);
  const Result want = run(false, false);
  struct Form {
    const char* name;
    bool late;
  };
  for (const Form& f : {Form{"in order", false}, Form{"in order, again", false}, Form{"product late", true},
                        Form{"product late, again", true}}) {
    const std::string tag = Tag(c) + ", " + f.name;
    const Result got = run(true, f.late);
    EXPECT_TRUE(gpu_testing::SameBits(got.rows, want.rows))
        << tag << ": rows differ from " << gpu_testing::FirstDifference(got.rows, want.rows);
    EXPECT_TRUE(gpu_testing::SameBits(got.rec, want.rec))
        << tag << ": state buffer differs from float " << gpu_testing::FirstDifference(got.rec, want.rec);
    EXPECT_LE(gpu_testing::LogError("gdn rows ready: out_y " + tag, RelL2(got.y, want.y)), 1e-5) << tag;
    EXPECT_EQ(got.counters, (std::vector<unsigned>{static_cast<unsigned>(vw), static_cast<unsigned>(in_rows - vw)}))
        << tag;
  }
  cuda::SetGdnOutBulk(was_bulk);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGdnRowsReadyTest,
                         ::testing::Values(RowsCase{{16, 32, 128, 128, 4}, 2048},  // Qwen3-Next-80B's
                                           RowsCase{{8, 16, 128, 128, 4}, 1024},   // the small preset's
                                           RowsCase{{4, 16, 64, 64, 4}, 512},      // clusters (4, 2)
                                           RowsCase{{8, 64, 128, 32, 2}, 256}),    // clusters (8, 1)
                         [](const ::testing::TestParamInfo<RowsCase>& info) { return Tag(info.param); });

// The product refuses counters whose split or first row lies outside the matrix's rows, launching
// nothing (cudaErrorInvalidValue), and takes both ends of the range.
TEST(GdnRowsReadyRefusalTest, CountersOutsideTheRowsAreRefused) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::Regrouped w = gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, 256, 64, 0.05f));
  const auto H = Upload(Random(rng, 256));
  const auto gamma = Upload(Random(rng, 256, 0.2f, 1.0f));
  auto y = Poisoned<float>(64);
  auto counters = Upload(std::vector<unsigned>{0u, 0u});
  cuda::MatVecNormIn in;
  in.H = H.get();
  in.gamma = gamma.get();
  in.eps = 1e-6f;
  struct Case {
    int64_t split, first_row;
    cudaError_t want;
  };
  for (const Case& k : {Case{65, 0, cudaErrorInvalidValue}, Case{-1, 0, cudaErrorInvalidValue},
                        Case{0, 64, cudaErrorInvalidValue}, Case{0, -1, cudaErrorInvalidValue},
                        Case{64, 63, cudaSuccess}, Case{0, 0, cudaSuccess}}) {
    in.ready = {counters.get(), k.split, k.first_row};
    EXPECT_EQ(cuda::LaunchDenseMatVecNormIn(w.m, in, y.get(), nullptr), k.want) << k.split << ", " << k.first_row;
  }
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  // The two accepted launches counted all 64 rows each: 64 + 0 below the split, 0 + 64 above it.
  EXPECT_EQ(Download(counters), (std::vector<unsigned>{64u, 64u}));
}

}  // namespace
}  // namespace tandem
