// The stacked GDN input product's polled rows (dense_matvec.cuh RowsPolled) and the fused kernel
// with ssm_out inside that polls them instead of waiting for the product's grid (gdn_decode_fused.cuh
// GdnDecodeFusedArgs::rows_polled), against the same two launches without, on copies of the same
// inputs: the product's rows and the whole state buffer the same bits, the layer's output rows
// within 1e-5 (added by atomics, whose order is not fixed). Then that the kernel waits for the
// rows: launched alone on rows still unwritten, which a copy engine writes 20 ms later from
// another stream, it must give the same results (without the polling it would read the unwritten
// NaNs); also with the ba rows copied another 20 ms after the rest, so that the gate thread's b and
// a are still unwritten when the conv's qkv values land (a gate form that read them unpolled after
// the conv's barrier, TANDEM_OLD_GDN_GATE=1, failed the 80B bench and was removed on 2026-12-05).
// Shapes: the 80B layer's, the small preset's, and clusters (4, 2) and (8, 1). Also what the
// product refuses.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
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

std::string Tag(const RowsCase& c) { return gdn_testing::LayerTag(c.d, c.h); }

class GpuGdnRowsPolledTest : public ::testing::TestWithParam<RowsCase> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

TEST_P(GpuGdnRowsPolledTest, PolledRowsGiveTheResultsOfTheWholeProduct) {
  const RowsCase& c = GetParam();
  const cuda::GdnShape& d = c.d;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t c_dim = d.c_dim(), vw = static_cast<int64_t>(d.nv) * d.dv;
  const int64_t in_rows = vw + c_dim + 2 * d.nv;  // [z; qkv; ba]
  const gdn_testing::StateLayout state_layout = gdn_testing::StateLayoutOf(d);
  const int64_t ssm_off = state_layout.ssm_off, row_stride = state_layout.row_stride;
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

  // The rows the product writes (the reference's), page-locked for the late copy.
  struct FreeHost {
    void operator()(float* p) const { (void)cudaFreeHost(p); }
  };
  std::unique_ptr<float, FreeHost> pinned_rows;
  {
    void* p = nullptr;
    ASSERT_EQ(cudaMallocHost(&p, static_cast<size_t>(in_rows) * sizeof(float)), cudaSuccess);
    pinned_rows.reset(static_cast<float*>(p));
  }
  float* pinned = pinned_rows.get();

  // One run: with polled rows (`polled`) the rows are filled unwritten first; `late`: the fused
  // kernel alone on `main`, the rows copied from `pinned` on `other` 20 ms later (with `ba_last`,
  // the ba rows, the stack's last 2·nv, another 20 ms after the rest: the conv's qkv values land
  // well before the gates' b and a); else the product then the kernel on `main`.
  struct Result {
    std::vector<float> rows, rec, y;
  };
  auto run = [&](bool polled, bool late, bool ba_last = false) -> Result {
    auto rows = Poisoned<float>(static_cast<size_t>(in_rows));  // 0xFF bytes: kRowUnwrittenBits
    auto rec = Upload(state0);
    auto y = Upload(y0);
    cuda::MatVecNormIn norm_in;
    norm_in.H = d_H.get();
    norm_in.y = y_in.get();
    norm_in.gamma = gamma.get();
    norm_in.eps = 1e-6f;
    norm_in.polled = {polled, vw};
    cuda::GdnDecodeFusedArgs args =
        gdn_testing::ReadingStackedRows(gdn_testing::OneTokenArgs(params, row_stride, seq_rows.get()), rows.get(), d);
    args.history = rec.get();
    args.state = rec.get() + ssm_off;
    args.rows_polled = polled;
    if (late) {
      EXPECT_EQ(cuda::LaunchGdnDecodeFusedOut(args, out_dev.m, y.get(), d, main->get(), by_columns.get(), c.h),
                cudaSuccess);
      const int64_t first_part = ba_last ? in_rows - 2 * d.nv : in_rows;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_EQ(cudaMemcpyAsync(rows.get(), pinned, static_cast<size_t>(first_part) * sizeof(float),
                                cudaMemcpyHostToDevice, other->get()),
                cudaSuccess);
      if (ba_last) {
        EXPECT_EQ(cudaStreamSynchronize(other->get()), cudaSuccess);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        EXPECT_EQ(cudaMemcpyAsync(rows.get() + first_part, pinned + first_part,
                                  static_cast<size_t>(in_rows - first_part) * sizeof(float), cudaMemcpyHostToDevice,
                                  other->get()),
                  cudaSuccess);
      }
    } else {
      EXPECT_EQ(cuda::LaunchDenseMatVecNormIn(in_dev.m, norm_in, rows.get(), main->get()), cudaSuccess);
      EXPECT_EQ(cuda::LaunchGdnDecodeFusedOut(args, out_dev.m, y.get(), d, main->get(), by_columns.get(), c.h),
                cudaSuccess);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return {Download(rows), Download(rec), Download(y)};
  };

  const bool was_bulk = cuda::GdnOutBulk();
  cuda::SetGdnOutBulk(true);
  const Result want = run(false, false);
  std::memcpy(pinned, want.rows.data(), static_cast<size_t>(in_rows) * sizeof(float));
  // Each also with the gated norm's one cluster barrier (GdnOutOneBarrier), whose z reads poll too,
  // and with the ba rows copied last.
  struct Form {
    const char* name;
    bool late, one_barrier, ba_last = false;
  };
  const bool was_one_barrier = cuda::GdnOutOneBarrier();
  for (const Form& f : {Form{"product then kernel", false, false}, Form{"product then kernel, again", false, false},
                        Form{"rows copied late", true, false}, Form{"rows copied late, again", true, false},
                        Form{"product then kernel, one barrier", false, true},
                        Form{"rows copied late, one barrier", true, true},
                        Form{"ba rows copied last", true, true, true},
                        Form{"ba rows copied last, two barriers", true, false, true}}) {
    const std::string tag = Tag(c) + ", " + f.name;
    cuda::SetGdnOutOneBarrier(f.one_barrier);
    const Result got = run(true, f.late, f.ba_last);
    cuda::SetGdnOutOneBarrier(was_one_barrier);
    EXPECT_TRUE(gpu_testing::SameBits(got.rows, want.rows))
        << tag << ": rows differ from " << gpu_testing::FirstDifference(got.rows, want.rows);
    EXPECT_TRUE(gpu_testing::SameBits(got.rec, want.rec))
        << tag << ": state buffer differs from float " << gpu_testing::FirstDifference(got.rec, want.rec);
    EXPECT_LE(gpu_testing::LogError("gdn rows polled: out_y " + tag, RelL2(got.y, want.y)), 1e-5) << tag;
  }
  cuda::SetGdnOutBulk(was_bulk);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGdnRowsPolledTest,
                         ::testing::Values(RowsCase{{16, 32, 128, 128, 4}, 2048},  // Qwen3-Next-80B's
                                           RowsCase{{8, 16, 128, 128, 4}, 1024},   // the small preset's
                                           RowsCase{{4, 16, 64, 64, 4}, 512},      // clusters (4, 2)
                                           RowsCase{{8, 64, 128, 32, 2}, 256}),    // clusters (8, 1)
                         [](const ::testing::TestParamInfo<RowsCase>& info) { return Tag(info.param); });

// The product refuses polled rows whose first row lies outside the matrix's rows, launching nothing
// (cudaErrorInvalidValue), and takes both ends of the range, writing every row either way.
TEST(GdnRowsPolledRefusalTest, AFirstRowOutsideTheRowsIsRefused) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::Regrouped w = gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, 256, 64, 0.05f));
  const auto H = Upload(Random(rng, 256));
  const auto gamma = Upload(Random(rng, 256, 0.2f, 1.0f));
  cuda::MatVecNormIn in;
  in.H = H.get();
  in.gamma = gamma.get();
  in.eps = 1e-6f;
  auto plain = Poisoned<float>(64);
  TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVecNormIn(w.m, in, plain.get(), nullptr));
  for (const int64_t first : {int64_t{64}, int64_t{-1}}) {
    in.polled = {true, first};
    EXPECT_EQ(cuda::LaunchDenseMatVecNormIn(w.m, in, plain.get(), nullptr), cudaErrorInvalidValue) << first;
  }
  for (const int64_t first : {int64_t{0}, int64_t{33}, int64_t{63}}) {
    in.polled = {true, first};
    auto y = Poisoned<float>(64);
    TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVecNormIn(w.m, in, y.get(), nullptr));
    EXPECT_TRUE(gpu_testing::SameBits(Download(y), Download(plain))) << "first row " << first;
  }
}

}  // namespace
}  // namespace tandem
