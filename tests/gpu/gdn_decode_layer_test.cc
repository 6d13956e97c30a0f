// The GDN layer of a one-token step in one launch (gdn_decode_fused.cuh LaunchGdnDecodeLayer: the
// stacked input product [z; qkv; ba] inside the fused kernel, gdn_decode_in.cuh) against the two
// launches it replaces, run on copies of the same inputs: the norm-in streaming product
// (LaunchDenseMatVecNormIn) into the stacked rows, then LaunchGdnDecodeFusedOut reading them. The
// product's rows within 1e-4 relative L2 (x as int16 with a scale per 32, ~1e-5), and what follows
// from them, the layer's output rows (out_y, with rows of its own past ssm_out's, as the router's)
// and the whole state buffer (histories, states, and the rows of sequences not in the step, which
// must stay as they were), within 1e-3; H is not written. Shapes: the 80B layer's, the small
// preset's, and the other two clusters of 256 columns, at widths 2048 down to 256; x formed from
// H alone, with the pending y, and with y and a gated shared term, H read before and after the PDL
// wait. Also: what the launch refuses.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/weights/weight_types.h"
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

struct LayerCase {
  cuda::GdnShape d;
  int64_t h;         // the stacked product's columns
  int64_t out_rows;  // ssm_out's rows (= h in a model)
};

std::string Tag(const LayerCase& c) { return gdn_testing::LayerTag(c.d, c.h); }

class GpuGdnDecodeLayerTest : public ::testing::TestWithParam<LayerCase> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

TEST_P(GpuGdnDecodeLayerTest, MatchesTheNormInProductThenTheFusedKernel) {
  const LayerCase& c = GetParam();
  const cuda::GdnShape& d = c.d;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t c_dim = d.c_dim(), vw = static_cast<int64_t>(d.nv) * d.dv;
  const int64_t in_rows = vw + c_dim + 2 * d.nv;
  const gdn_testing::StateLayout state_layout = gdn_testing::StateLayoutOf(d);
  const int64_t ssm_off = state_layout.ssm_off, row_stride = state_layout.row_stride;
  const gdn_testing::GdnParams params = gdn_testing::RandomGdnParams(rng, d);
  // Three sequence rows; the token's is row 1.
  const std::vector<float> state0 = Random(rng, static_cast<size_t>(3 * row_stride), 0.3f);
  const auto seq_rows = Upload(std::vector<int32_t>{1});
  // The stacked input matrix and ssm_out with 16 rows of its own after its rows, by columns.
  const gpu_testing::TestMatrix w_in = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, c.h, in_rows, 0.05f);
  const gpu_testing::Regrouped in_dev = gpu_testing::Regroup(w_in);
  const gpu_testing::TestMatrix w_out = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, vw, c.out_rows, 0.05f);
  const gpu_testing::Regrouped out_dev = gpu_testing::Regroup(w_out);
  const int64_t total = c.out_rows + 16;
  const gpu_testing::TestMatrix w_extra = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, vw, 16, 0.05f);
  const gpu_testing::Regrouped extra_dev = gpu_testing::Regroup(w_extra);
  auto by_columns = Poisoned<uint8_t>(static_cast<size_t>(cuda::Q8_0x8ByColumnsBytes(total, vw)));
  TANDEM_ASSERT_CUDA(cuda::CopyQ8_0x8ByColumns(out_dev.m, by_columns.get(), nullptr, total));
  TANDEM_ASSERT_CUDA(cuda::CopyQ8_0x8ByColumns(extra_dev.m, by_columns.get() + c.out_rows * cuda::kQ8_0x8SuperBytes,
                                               nullptr, total));
  ASSERT_TRUE(cuda::GdnDecodeLayerFits(d, out_dev.m, in_dev.m, total)) << Tag(c);
  if (d.dk == 128) {  // diagnosis: the clusters this device holds at once, without and with the product
    int fused = 0, layer = 0;
    TANDEM_ASSERT_CUDA(cuda::GdnDecodeOutMaxActiveClusters(d, out_dev.m, total, nullptr, &fused));
    TANDEM_ASSERT_CUDA(cuda::GdnDecodeOutMaxActiveClusters(d, out_dev.m, total, &in_dev.m, &layer));
    std::printf("[ clusters ] %s: %d key head groups; the device holds %d clusters of the fused kernel, %d of the "
                "one-launch layer\n", Tag(c).c_str(), d.nk, fused, layer);
  }
  // The norm's inputs.
  const std::vector<float> H = Random(rng, static_cast<size_t>(c.h));
  const auto d_H = Upload(H);
  const auto gamma = Upload(Random(rng, static_cast<size_t>(c.h), 0.2f, 1.0f));
  const auto y_in = Upload(Random(rng, static_cast<size_t>(c.h), 0.5f));
  const auto shared = Upload(Random(rng, static_cast<size_t>(c.h), 0.5f));
  const auto gate_logit = Upload(Random(rng, 1));
  const std::vector<float> y0 = Random(rng, static_cast<size_t>(total));
  const bool was_bulk = cuda::GdnOutBulk();
  cuda::SetGdnOutBulk(true);
  struct Form {
    const char* name;
    bool y, shared, h_early;
  };
  for (const Form& f : {Form{"H alone", false, false, false}, Form{"H + y", true, false, true},
                        Form{"H + y + shared", true, true, false}, Form{"H + y + shared, H early", true, true, true}}) {
    const std::string tag = Tag(c) + ", " + f.name;
    cuda::MatVecNormIn norm_in;
    norm_in.H = d_H.get();
    norm_in.y = f.y ? y_in.get() : nullptr;
    norm_in.sh.shared = f.shared ? shared.get() : nullptr;
    norm_in.sh.gate_logit = f.shared ? gate_logit.get() : nullptr;
    norm_in.gamma = gamma.get();
    norm_in.eps = 1e-6f;
    norm_in.h_written_earlier = f.h_early;
    const cuda::GdnDecodeFusedArgs args = gdn_testing::OneTokenArgs(params, row_stride, seq_rows.get());
    // The two launches.
    auto rows_want = Poisoned<float>(static_cast<size_t>(in_rows));
    auto rec_want = Upload(state0);
    auto y_want = Upload(y0);
    TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVecNormIn(in_dev.m, norm_in, rows_want.get(), nullptr));
    cuda::GdnDecodeFusedArgs two = gdn_testing::ReadingStackedRows(args, rows_want.get(), d);
    two.history = rec_want.get();
    two.state = rec_want.get() + ssm_off;
    TANDEM_ASSERT_CUDA(
        cuda::LaunchGdnDecodeFusedOut(two, out_dev.m, y_want.get(), d, nullptr, by_columns.get(), total));
    // The one launch.
    auto rows_got = Poisoned<float>(static_cast<size_t>(in_rows));
    auto rec_got = Upload(state0);
    auto y_got = Upload(y0);
    cuda::GdnDecodeIn layer;
    layer.w = in_dev.m;
    layer.qkv_row0 = vw;
    layer.ba_row0 = vw + c_dim;
    layer.norm = norm_in;
    layer.rows = rows_got.get();
    cuda::GdnDecodeFusedArgs one = args;
    one.history = rec_got.get();
    one.state = rec_got.get() + ssm_off;
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnDecodeLayer(one, out_dev.m, y_got.get(), d, layer, nullptr, by_columns.get(), total));
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_LE(gpu_testing::LogError("gdn layer: input rows " + tag, RelL2(Download(rows_got), Download(rows_want))), 1e-4)
        << tag;
    EXPECT_LE(gpu_testing::LogError("gdn layer: out_y " + tag, RelL2(Download(y_got), Download(y_want))), 1e-3) << tag;
    const std::vector<float> rec_g = Download(rec_got), rec_w = Download(rec_want);
    EXPECT_LE(gpu_testing::LogError("gdn layer: state rows " + tag, RelL2(rec_g, rec_w)), 1e-3) << tag;
    // The rows of the sequences not in the step: untouched.
    EXPECT_EQ(std::memcmp(rec_g.data(), state0.data(), row_stride * sizeof(float)), 0) << tag << ": row 0 written";
    EXPECT_EQ(std::memcmp(rec_g.data() + 2 * row_stride, state0.data() + 2 * row_stride, row_stride * sizeof(float)), 0)
        << tag << ": row 2 written";
    EXPECT_EQ(Download(d_H), H) << tag << ": H written";
  }
  cuda::SetGdnOutBulk(was_bulk);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGdnDecodeLayerTest,
                         ::testing::Values(LayerCase{{16, 32, 128, 128, 4}, 2048, 2048},  // Qwen3-Next-80B's
                                           LayerCase{{8, 16, 128, 128, 4}, 1024, 1024},   // the small preset's
                                           LayerCase{{4, 16, 64, 64, 4}, 512, 512},       // clusters (4, 2)
                                           LayerCase{{8, 64, 128, 32, 2}, 256, 8}),      // clusters (8, 1)
                         [](const ::testing::TestParamInfo<LayerCase>& info) { return Tag(info.param); });

// Diagnosis, not a test of speed (nothing here asserts a time): the 80B layer's two launches and the
// one launch timed alone on a cold L2 (a 256 MB write before each), and the one launch's phases
// (GdnDecodeIn::probe) as us after each block's entry, median and last block.
TEST(GpuGdnDecodeLayerTiming, PrintsTimesAndPhases) {
  TANDEM_SKIP_WITHOUT_GPU();
  const cuda::GdnShape d{16, 32, 128, 128, 4};
  const int64_t h = 2048, c_dim = d.c_dim(), vw = 32 * 128, in_rows = vw + c_dim + 64, total = 2048 + 1040;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gdn_testing::StateLayout state_layout = gdn_testing::StateLayoutOf(d);
  const int64_t ssm_off = state_layout.ssm_off, row_stride = state_layout.row_stride;
  const gdn_testing::GdnParams params = gdn_testing::RandomGdnParams(rng, d);
  const auto seq_rows = Upload(std::vector<int32_t>{0});
  auto rec = Upload(Random(rng, static_cast<size_t>(row_stride), 0.3f));
  const gpu_testing::Regrouped in_dev =
      gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, h, in_rows, 0.05f));
  const gpu_testing::Regrouped out_dev =
      gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, vw, total, 0.05f));
  auto by_columns = Poisoned<uint8_t>(static_cast<size_t>(cuda::Q8_0x8ByColumnsBytes(total, vw)));
  TANDEM_ASSERT_CUDA(cuda::CopyQ8_0x8ByColumns(out_dev.m, by_columns.get(), nullptr, total));
  cuda::DeviceMatrix out = out_dev.m;
  out.rows = 2048;
  const auto H = Upload(Random(rng, static_cast<size_t>(h)));
  const auto gamma = Upload(Random(rng, static_cast<size_t>(h), 0.2f, 1.0f));
  const auto y_in = Upload(Random(rng, static_cast<size_t>(h), 0.5f));
  auto y = Upload(std::vector<float>(static_cast<size_t>(total), 0.0f));
  auto rows = Poisoned<float>(static_cast<size_t>(in_rows));
  auto flush = Poisoned<uint8_t>(size_t{256} << 20);
  cuda::MatVecNormIn norm_in;
  norm_in.H = H.get();
  norm_in.y = y_in.get();
  norm_in.gamma = gamma.get();
  norm_in.eps = 1e-6f;
  cuda::GdnDecodeFusedArgs args = gdn_testing::OneTokenArgs(params, row_stride, seq_rows.get());
  args.history = rec.get();
  args.state = rec.get() + ssm_off;
  const cuda::GdnDecodeFusedArgs two = gdn_testing::ReadingStackedRows(args, rows.get(), d);
  const int blocks = d.nv * (d.dv / 32);
  auto probe = Poisoned<unsigned long long>(static_cast<size_t>(blocks * cuda::kInProbePhases));
  cuda::GdnDecodeIn layer;
  layer.w = in_dev.m;
  layer.qkv_row0 = vw;
  layer.ba_row0 = vw + c_dim;
  layer.norm = norm_in;
  layer.rows = rows.get();
  const bool was_bulk = cuda::GdnOutBulk();
  cuda::SetGdnOutBulk(true);
  cudaEvent_t e0, e1;
  TANDEM_ASSERT_CUDA(cudaEventCreate(&e0));
  TANDEM_ASSERT_CUDA(cudaEventCreate(&e1));
  std::vector<float> t_two, t_one;
  for (int rep = 0; rep < 7; ++rep) {
    for (int form = 0; form < 2; ++form) {
      TANDEM_ASSERT_CUDA(cudaMemsetAsync(flush.get(), rep, size_t{256} << 20, nullptr));
      TANDEM_ASSERT_CUDA(cudaEventRecord(e0, nullptr));
      if (form == 0) {
        TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVecNormIn(in_dev.m, norm_in, rows.get(), nullptr));
        TANDEM_ASSERT_CUDA(cuda::LaunchGdnDecodeFusedOut(two, out, y.get(), d, nullptr, by_columns.get(), total));
      } else {
        layer.probe = rep == 6 ? probe.get() : nullptr;
        TANDEM_ASSERT_CUDA(cuda::LaunchGdnDecodeLayer(args, out, y.get(), d, layer, nullptr, by_columns.get(), total));
      }
      TANDEM_ASSERT_CUDA(cudaEventRecord(e1, nullptr));
      TANDEM_ASSERT_CUDA(cudaEventSynchronize(e1));
      float ms = 0.0f;
      TANDEM_ASSERT_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      if (rep > 0) (form == 0 ? t_two : t_one).push_back(1e3f * ms);
    }
  }
  cuda::SetGdnOutBulk(was_bulk);
  TANDEM_ASSERT_CUDA(cudaEventDestroy(e0));
  TANDEM_ASSERT_CUDA(cudaEventDestroy(e1));
  std::sort(t_two.begin(), t_two.end());
  std::sort(t_one.begin(), t_one.end());
  std::printf("[ timing   ] 80B GDN layer on a cold L2, median of 6: product then fused kernel %.2f us, one launch "
              "%.2f us\n", t_two[3], t_one[3]);
  const std::vector<unsigned long long> st = Download(probe);
  const char* names[cuda::kInProbePhases] = {"entry", "wait returned", "x formed", "first chunk landed",
                                              "last chunk summed", "cluster rows ready", "gated outputs", "exit"};
  for (int p = 1; p < cuda::kInProbePhases; ++p) {
    std::vector<double> v;
    for (int b = 0; b < blocks; ++b) v.push_back(1e-3 * static_cast<double>(st[b * cuda::kInProbePhases + p] - st[b * cuda::kInProbePhases]));
    std::sort(v.begin(), v.end());
    std::printf("[ phases   ] %-20s median %7.2f us, last %7.2f us after entry\n", names[p], v[v.size() / 2], v.back());
  }
  unsigned long long first = ~0ull, last = 0;
  for (int b = 0; b < blocks; ++b) {
    first = std::min(first, st[b * cuda::kInProbePhases]);
    last = std::max(last, st[b * cuda::kInProbePhases + 7]);
  }
  std::printf("[ phases   ] first entry to last exit %.2f us\n", 1e-3 * static_cast<double>(last - first));
}

// What the one launch refuses, launching nothing: the stacked row count not the layer's, a row
// wider than 2048 columns, shapes LaunchGdnDecodeFusedOut refuses (cudaErrorNotSupported); no rows
// buffer, no H, the output product's rows not by columns (cudaErrorInvalidValue).
TEST(GdnDecodeLayerRefusalTest, WhatTheLaunchDoesNotTake) {
  TANDEM_SKIP_WITHOUT_GPU();
  const cuda::GdnShape d{16, 32, 128, 128, 4};
  const int64_t vw = 32 * 128, in_rows = vw + d.c_dim() + 64;
  alignas(16) static const uint8_t kBytes[16] = {};  // never read: every case is refused first
  auto mat = [&](int64_t cols, int64_t rows) {
    return cuda::DeviceMatrix{cuda::kTypeQ8_0x8, kBytes, cols, rows, cuda::Q8_0x8RowBytes(cols)};
  };
  const cuda::DeviceMatrix out = mat(vw, 2048);
  EXPECT_TRUE(cuda::GdnDecodeLayerFits(d, out, mat(2048, in_rows), 0));
  EXPECT_FALSE(cuda::GdnDecodeLayerFits(d, out, mat(2048, in_rows - 8), 0)) << "rows";
  EXPECT_FALSE(cuda::GdnDecodeLayerFits(d, out, mat(4096, in_rows), 0)) << "4096 columns";
  EXPECT_FALSE(cuda::GdnDecodeLayerFits(cuda::GdnShape{2, 4, 64, 64, 4}, out, mat(2048, 256 + 512 + 8), 0))
      << "128 columns a cluster";
  cuda::GdnDecodeFusedArgs args;  // never dereferenced
  cuda::GdnDecodeIn in;
  in.w = mat(2048, in_rows - 8);
  EXPECT_EQ(cuda::LaunchGdnDecodeLayer(args, out, nullptr, d, in, nullptr, kBytes), cudaErrorNotSupported);
  in.w = mat(2048, in_rows);
  in.qkv_row0 = vw;
  in.ba_row0 = vw + d.c_dim();
  EXPECT_EQ(cuda::LaunchGdnDecodeLayer(args, out, nullptr, d, in, nullptr, kBytes), cudaErrorInvalidValue)
      << "no rows, no H";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace tandem
