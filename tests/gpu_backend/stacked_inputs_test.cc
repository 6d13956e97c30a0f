// The decode input stacks of the upload (cuda::GpuLayer::mixer_in, device_model.h): each layer's
// view covers its parts' rows ([z; qkv; ba] or [q; k; v]) adjacent and complete (and the qkv_ba and
// kv views the rows of [qkv; ba] and [k; v]), no weight byte is
// stored twice, TANDEM_OLD_DECODE_INPUTS (SetStackedDecodeInputs(false)) makes none, and the
// stacked product gives each part's rows what the part's own product gives (to the last place or
// within 1e-6: the stream kernel's split of a row may depend on the row count, and ba alone stays
// plain Q8_0, read by another kernel). The placement arithmetic runs without a GPU; the rest skips.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/model/reference_model.h"
#include "gpu_service/backends/cuda/backend/device_model.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gtest/gtest.h"
#include "tests/gpu_backend/backend_test_open.h"
#include "tests/gpu_backend/backend_test_util.h"
#include "tests/gpu_backend/device_arrays.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using gpu_backend_testing::DeviceArrayOf;
using gpu_backend_testing::DeviceCopy;
using gpu_backend_testing::HostCopy;
using gpu_backend_testing::OpenPresetWeights;
using gpu_backend_testing::PresetTestName;
using gpu_backend_testing::RelativeL2;
using gpu_backend_testing::UploadOffAndOn;

bool Adjacent(int64_t cols, std::vector<int64_t> rows) { return Q8_0x8PartsAdjacent(cols, rows.data(), rows.size()); }

// A Q8_0x8 row of 2048 columns is 2176 bytes: 2 rows end on a 256-byte boundary (4352 = 17·256), 1 does not.
TEST(StackedInputsPlacement, PartsStayAdjacentOnlyWhenEachEndsOnABoundary) {
  EXPECT_TRUE(Adjacent(2048, {4096, 8192, 64}));  // q3n-80b GDN: z, qkv, ba
  EXPECT_TRUE(Adjacent(2048, {8192, 512, 512}));  // q3n-80b attention: q, k, v
  EXPECT_TRUE(Adjacent(2048, {2, 3}));            // the last part may end anywhere
  EXPECT_FALSE(Adjacent(2048, {3, 2}));
  EXPECT_TRUE(Adjacent(256, {16, 8}));            // 16 · 272 = 4352
  EXPECT_FALSE(Adjacent(256, {8, 16}));           // 8 · 272 = 2176
  EXPECT_FALSE(Adjacent(300, {16, 16}));          // not whole super-blocks
  EXPECT_FALSE(Adjacent(2048, {0, 16}));
  EXPECT_FALSE(Adjacent(2048, {}));
}

struct Parts {
  std::array<const DeviceMatrix*, 3> m;
};
// The parts of a layer's stack in their placement order.
Parts PartsOf(const GpuLayer& l) {
  if (l.kind == LayerKind::kGdn) return {{&l.z, &l.qkv, &l.ba}};
  return {{&l.q, &l.k, &l.v}};
}

class StackedInputsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StackedInputsTest, ViewsAreAdjacentCompleteAndGiveThePartsRows) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const std::unique_ptr<ReferenceModel> model = OpenPresetWeights(GetParam());
  ASSERT_TRUE(model);
  const auto dm = UploadOffAndOn(*model, [](bool on) { SetStackedDecodeInputs(on); }, StackedDecodeInputs());
  ASSERT_TRUE(dm[0] && dm[1]);
  // Regrouping ba keeps its bytes (Q8_0x8 rows are as long as Q8_0 rows): the same allocation.
  EXPECT_EQ(dm[0]->bytes, dm[1]->bytes);
  ASSERT_EQ(dm[0]->layers.size(), dm[1]->layers.size());
  std::mt19937 rng = testing::SeededRng();
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  int stacked = 0;
  double worst = 0;
  bool identical = true;
  for (size_t i = 0; i < dm[1]->layers.size(); ++i) {
    const GpuLayer& off = dm[0]->layers[i];
    const GpuLayer& on = dm[1]->layers[i];
    EXPECT_FALSE(off.mixer_in.present()) << "layer " << i;
    ASSERT_TRUE(on.mixer_in.present()) << "layer " << i << ": the presets' Q8_0 mixer inputs stack";
    ++stacked;
    const Parts p = PartsOf(on), q = PartsOf(off);
    const DeviceMatrix& in = on.mixer_in;
    EXPECT_EQ(in.type, kTypeQ8_0x8);
    EXPECT_EQ(in.data, p.m[0]->data);
    const uint8_t* next = static_cast<const uint8_t*>(in.data);
    int64_t rows = 0;
    for (const DeviceMatrix* m : p.m) {
      EXPECT_EQ(m->type, kTypeQ8_0x8);
      EXPECT_EQ(m->cols, in.cols);
      EXPECT_EQ(m->row_bytes, in.row_bytes);
      EXPECT_EQ(m->data, static_cast<const void*>(next)) << "layer " << i << ": parts not adjacent";
      next += m->rows * m->row_bytes;
      rows += m->rows;
    }
    EXPECT_EQ(in.rows, rows) << "layer " << i;
    // The second view: GDN's [qkv; ba], attention's [k; v].
    const bool gdn = on.kind == LayerKind::kGdn;
    const DeviceMatrix& tail = gdn ? on.qkv_ba : on.kv;
    EXPECT_EQ(tail.type, kTypeQ8_0x8);
    EXPECT_EQ(tail.data, p.m[1]->data);
    EXPECT_EQ(tail.rows, p.m[1]->rows + p.m[2]->rows);
    EXPECT_EQ(tail.cols, in.cols);
    EXPECT_EQ(tail.row_bytes, in.row_bytes);
    EXPECT_FALSE((gdn ? on.kv : on.qkv_ba).present());
    EXPECT_FALSE(off.qkv_ba.present());
    EXPECT_FALSE(off.kv.present());
    // The stacked products (mixer_in; qkv_ba or kv) against each part's own product of the old layout,
    // at 1 and 3 rows.
    std::vector<std::pair<const DeviceMatrix*, std::vector<const DeviceMatrix*>>> views = {
        {&in, {q.m[0], q.m[1], q.m[2]}}};
    views.push_back({&tail, {q.m[1], q.m[2]}});
    for (const auto& [view, parts] : views) {
      for (int n : {1, 3}) {
        std::vector<float> x(static_cast<size_t>(n * view->cols));
        for (float& v : x) v = uni(rng);
        float* dx = DeviceCopy(x);
        float* dy = DeviceArrayOf<float>(static_cast<size_t>(n * view->rows));
        ASSERT_EQ(LaunchDenseMatVec(*view, dx, view->cols, n, dy, view->rows, nullptr), cudaSuccess);
        const std::vector<float> y = HostCopy(dy, static_cast<size_t>(n * view->rows));
        int64_t first = 0;
        for (size_t k = 0; k < parts.size(); ++k) {
          const DeviceMatrix& part = *parts[k];
          float* dp = DeviceArrayOf<float>(static_cast<size_t>(n * part.rows));
          ASSERT_EQ(LaunchDenseMatVec(part, dx, part.cols, n, dp, part.rows, nullptr), cudaSuccess);
          const std::vector<float> want = HostCopy(dp, static_cast<size_t>(n * part.rows));
          for (int t = 0; t < n; ++t) {
            const float* got = y.data() + t * view->rows + first;
            const float* ref = want.data() + t * part.rows;
            identical &= std::memcmp(got, ref, static_cast<size_t>(part.rows) * sizeof(float)) == 0;
            const double e = RelativeL2(got, ref, part.rows);
            worst = std::max(worst, e);
            EXPECT_LE(e, 1e-6) << "layer " << i << " view of " << view->rows << " rows, part " << k << ", n " << n
                               << ", token " << t;
          }
          first += part.rows;
          cudaFree(dp);
        }
        EXPECT_EQ(first, view->rows);
        cudaFree(dx);
        cudaFree(dy);
      }
    }
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  printf("[%s] %d stacked layers; stacked product vs parts: %s, worst relative L2 %.3g\n", GetParam().c_str(),
         stacked, identical ? "bit-identical" : "not bit-identical", worst);
}

INSTANTIATE_TEST_SUITE_P(Presets, StackedInputsTest, ::testing::Values("tiny-q3n", "small"), PresetTestName);

}  // namespace
}  // namespace tandem::cuda
