// gtest helpers of the CUDA backend tests: open a backend on a preset with chosen fast parts, run
// one step, compare rows of logits. (backend_test_util.h has the helpers that need no gtest.)
#ifndef TANDEM_TESTS_GPU_BACKEND_BACKEND_TEST_OPEN_H_
#define TANDEM_TESTS_GPU_BACKEND_BACKEND_TEST_OPEN_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/reference_model.h"
#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#include "gpu_service/backends/cuda/backend/device_model.h"
#include "gtest/gtest.h"
#include "tests/gpu_backend/backend_test_util.h"

namespace tandem::gpu_backend_testing {

// The test name of a preset parameter: "tiny-q3n" -> "tiny_q3n" (gtest names take no '-').
inline std::string PresetTestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

// The CPU reference model of the file at `path` with `threads` worker threads (0: every hardware
// thread; tests that only read its weights take 1), or nullptr after a test failure.
inline std::unique_ptr<ReferenceModel> OpenReference(const std::string& path, int threads = 0) {
  ReferenceModelOptions o;
  o.threads = threads;
  absl::StatusOr<std::unique_ptr<ReferenceModel>> m = ReferenceModel::Open(path, o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// The preset's CPU reference model for its weights only (one thread), or nullptr after a test
// failure.
inline std::unique_ptr<ReferenceModel> OpenPresetWeights(const std::string& preset) {
  absl::StatusOr<std::string> path = PresetModel(preset);
  EXPECT_TRUE(path.ok()) << path.status();
  return path.ok() ? OpenReference(*path, /*threads=*/1) : nullptr;
}

// model's weights uploaded twice, set(false) before the first upload and set(true) before the
// second (a switch that UploadModel reads), then set(restore); a null entry after a test failure.
inline std::array<std::unique_ptr<cuda::DeviceModel>, 2> UploadOffAndOn(const ReferenceModel& model,
                                                                         const std::function<void(bool)>& set,
                                                                         bool restore) {
  std::array<std::unique_ptr<cuda::DeviceModel>, 2> dm;
  for (int on = 0; on < 2; ++on) {
    set(on == 1);
    absl::StatusOr<std::unique_ptr<cuda::DeviceModel>> m = cuda::UploadModel(model.config(), model.weights());
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) dm[on] = *std::move(m);
  }
  set(restore);
  return dm;
}

// Which parts of fast mode run reduced precision (CudaBackendOptions::fast_*).
struct FastParts {
  bool dense = true, experts = true, attention = true, gdn = true;
  // Dense products split (three f16 products of hi/lo halves; f16 + fp8 at >= 2048 x 2048 weights),
  // CudaBackendOptions::fast_dense_split; false, the backend's default: one f16 product each.
  bool dense_split = false;
  // The split as one f16 product plus one fp8 correction for every matrix (cuda::SetSplitF8 and
  // SetSplitF8MinWeights(0) while the backend is opened; false: the process defaults).
  bool split_f8 = false;
  // The mixers' output products (ssm_out, o) as one f16 product (CudaBackendOptions::
  // fast_dense_out_single, the default; TANDEM_DENSE_OUT_SINGLE, where set, overrides it for every
  // backend opened).
  bool dense_out_single = true;
};

inline std::unique_ptr<CudaBackend> OpenGpu(const std::string& path, CudaMode mode, bool dense_gemm = true,
                                            bool expert_gemm = true, bool graphs = true, FastParts parts = {},
                                            bool pdl = true, int l2_prefetch = CudaBackendOptions{}.l2_prefetch) {
  CudaBackendOptions o;
  o.cuda_graphs = graphs;
  o.pdl = pdl;
  o.l2_prefetch = l2_prefetch;
  o.fast_attention = parts.attention;
  o.fast_gdn = parts.gdn;
  o.fast_dense_split = parts.dense_split;
  o.fast_dense_out_single = parts.dense_out_single;
  o.mode = mode;
  o.fast_dense_gemm = dense_gemm;
  o.fast_expert_gemm = expert_gemm;
  o.max_batch_tokens = 192;
  o.max_sequences = 6;
  o.max_context = 256;
  absl::StatusOr<std::unique_ptr<CudaBackend>> b = CudaBackend::Open(path, o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : nullptr;
}

inline std::vector<float> GpuStep(CudaBackend& b, SequenceSlot slot, const std::vector<int32_t>& tokens, bool all) {
  std::vector<float> logits((all ? tokens.size() : 1) * b.config().vocab);
  const Backend::StepInput in{slot, tokens, logits.data(), all};
  const absl::Status s = b.Step(std::span<const Backend::StepInput>(&in, 1));
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

// The largest per-position relative L2 error of got against want (rows of V).
inline double MaxRowError(const std::vector<float>& got, const std::vector<float>& want, int64_t V,
                          int64_t* worst = nullptr) {
  double max_err = 0;
  for (size_t r = 0; r * V < want.size(); ++r) {
    const double e = RelativeL2(got.data() + r * V, want.data() + r * V, V);
    if (e > max_err || std::isnan(e)) {
      max_err = std::isnan(e) ? INFINITY : e;
      if (worst) *worst = static_cast<int64_t>(r);
    }
  }
  return max_err;
}

}  // namespace tandem::gpu_backend_testing

#endif  // TANDEM_TESTS_GPU_BACKEND_BACKEND_TEST_OPEN_H_
