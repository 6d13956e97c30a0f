// GpuLayer::ssm_out_by_columns (device_model.h): the upload adds, for every GDN layer whose ssm_out
// is Q8_0x8, a copy holding the same super-blocks by columns (super-block j of row r at
// (j·rows + r)·272, device_matrix.h), byte for byte; TANDEM_GDN_OUT_BY_COLUMNS=0
// (SetGdnOutByColumns(false)) makes none and keeps every other tensor where it was.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/model/reference_model.h"
#include "gpu_service/backends/cuda/backend/device_model.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/route_compose.cuh"
#include "gtest/gtest.h"
#include "tests/gpu_backend/backend_test_open.h"
#include "tests/gpu_backend/backend_test_util.h"
#include "tests/gpu_backend/device_arrays.h"

namespace tandem::cuda {
namespace {

using gpu_backend_testing::HostCopy;
using gpu_backend_testing::OpenPresetWeights;
using gpu_backend_testing::PresetTestName;
using gpu_backend_testing::UploadOffAndOn;

class OutByColumnsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OutByColumnsTest, UploadCopiesSsmOutByColumns) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const std::unique_ptr<ReferenceModel> model = OpenPresetWeights(GetParam());
  ASSERT_TRUE(model);
  const auto dm = UploadOffAndOn(*model, [](bool on) { SetGdnOutByColumns(on); }, GdnOutByColumns());
  ASSERT_TRUE(dm[0] && dm[1]);
  ASSERT_EQ(dm[0]->layers.size(), dm[1]->layers.size());
  uint64_t copies = 0;
  int gdn_layers = 0, route_layers = 0;
  for (size_t i = 0; i < dm[1]->layers.size(); ++i) {
    const GpuLayer& off = dm[0]->layers[i];
    const GpuLayer& on = dm[1]->layers[i];
    EXPECT_EQ(off.ssm_out_by_columns, nullptr) << "layer " << i;
    if (on.kind != LayerKind::kGdn || on.ssm_out.type != kTypeQ8_0x8) {
      EXPECT_EQ(on.ssm_out_by_columns, nullptr) << "layer " << i;
      continue;
    }
    ++gdn_layers;
    ASSERT_NE(on.ssm_out_by_columns, nullptr) << "layer " << i;
    const DeviceMatrix& m = on.ssm_out;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(on.ssm_out_by_columns) % 16, 0u) << "layer " << i;
    // The copy's rows: ssm_out's, then the router's two terms when the layer carries them
    // (RouteThroughOut, on by default; route_compose_test.cc checks their values).
    const int64_t total = on.ssm_out_by_columns_rows;
    EXPECT_EQ(total, m.rows + (on.route_rows > 0 ? 2 * RoutePaddedRows(on.route_rows) : 0)) << "layer " << i;
    EXPECT_EQ(on.route_rows > 0, on.route_inv_scale != nullptr) << "layer " << i;
    copies += static_cast<uint64_t>(Q8_0x8ByColumnsBytes(total, m.cols));
    if (on.route_rows > 0) {
      copies += static_cast<uint64_t>(RoutePaddedRows(on.route_rows)) * sizeof(float);
      ++route_layers;
    }
    const std::vector<uint8_t> rows =
        HostCopy(static_cast<const uint8_t*>(m.data), static_cast<size_t>(m.rows * m.row_bytes));
    const std::vector<uint8_t> cols = HostCopy(static_cast<const uint8_t*>(on.ssm_out_by_columns),
                                               static_cast<size_t>(Q8_0x8ByColumnsBytes(total, m.cols)));
    for (int64_t r = 0; r < m.rows; ++r) {
      for (int64_t j = 0; j < m.cols / 256; ++j) {
        const uint8_t* want = &rows[r * m.row_bytes + j * kQ8_0x8SuperBytes];
        ASSERT_EQ(std::memcmp(&cols[(j * total + r) * kQ8_0x8SuperBytes], want, kQ8_0x8SuperBytes), 0)
            << "layer " << i << " row " << r << " super-block " << j;
      }
    }
    // The rows themselves are the same bytes as without the copy.
    EXPECT_EQ(rows, HostCopy(static_cast<const uint8_t*>(off.ssm_out.data), rows.size())) << "layer " << i;
  }
  std::printf("[%s] %d GDN layers with ssm_out by columns (%d with the router's rows), %.2f MB of copies\n",
              GetParam().c_str(), gdn_layers, route_layers, static_cast<double>(copies) / 1e6);
  // small's ssm_out is over the regrouping size (Q8_0x8); tiny-q3n's stays ggml Q8_0 (no copy).
  if (GetParam() == "small") {
    EXPECT_GT(gdn_layers, 0) << "small's ssm_out is Q8_0x8";
    if (RouteThroughOut()) {
      EXPECT_EQ(route_layers, gdn_layers) << "small's router is f32";
    }
  }
  // The copies and the router rows' scales (each 256-byte aligned) are the only bytes added.
  EXPECT_GE(dm[1]->bytes, dm[0]->bytes + copies);
  EXPECT_LE(dm[1]->bytes, dm[0]->bytes + copies + 256 * static_cast<uint64_t>(gdn_layers + route_layers));
}

INSTANTIATE_TEST_SUITE_P(Presets, OutByColumnsTest, ::testing::Values("tiny-q3n", "small"), PresetTestName);

}  // namespace
}  // namespace tandem::cuda
