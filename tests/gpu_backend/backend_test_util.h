// Helpers of the CUDA backend tests and profile: GPU detection, generated preset models (made once
// per process, or reused from $TANDEM_GPU_BACKEND_MODELS), running the CPU reference, errors.
#ifndef TANDEM_TESTS_GPU_BACKEND_BACKEND_TEST_UTIL_H_
#define TANDEM_TESTS_GPU_BACKEND_BACKEND_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/model/reference_model.h"
#include "common/model_gen/model_generator.h"
#include "common/model_gen/model_spec.h"
#include "gpu_service/backends/cuda/backend/cuda_backend.h"

namespace tandem::gpu_backend_testing {

// Empty when a CUDA device is usable, else why not.
inline std::string NoGpuReason() { return CudaDeviceUnavailableReason(); }

// Skips the calling test, saying why, where no CUDA device is usable (CI).
#define TANDEM_BACKEND_SKIP_WITHOUT_GPU()                                                       \
  do {                                                                                          \
    if (std::string r = ::tandem::gpu_backend_testing::NoGpuReason(); !r.empty())               \
      GTEST_SKIP() << "GPU test skipped: " << r;                                                \
  } while (0)

// The path of preset `name`'s file, generated on first use. Directory: $TANDEM_GPU_BACKEND_MODELS
// (an existing file there is reused) or a fresh temporary directory of this process.
inline absl::StatusOr<std::string> PresetModel(const std::string& name) {
  static std::map<std::string, std::string>* made = new std::map<std::string, std::string>();
  if (auto it = made->find(name); it != made->end()) return it->second;
  std::string dir;
  if (const char* env = std::getenv("TANDEM_GPU_BACKEND_MODELS"); env != nullptr && *env != '\0') {
    dir = env;
  } else {
    dir = (std::filesystem::temp_directory_path() / absl::StrCat("tandem-gpu-backend-", getpid())).string();
  }
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name + ".gguf";
  if (!std::filesystem::exists(path)) {
    // "PRESET@L": the preset with L main layers (q3n-80b@4: the 80B shapes, one attention layer).
    const size_t at = name.find('@');
    absl::StatusOr<GenModelSpec> spec = PresetSpec(name.substr(0, at));
    if (!spec.ok()) return spec.status();
    if (at != std::string::npos && !absl::SimpleAtoi(name.substr(at + 1), &spec->layers)) {
      return absl::InvalidArgumentError(absl::StrCat("preset ", name, ": no layer count after '@'"));
    }
    if (absl::Status s = GenerateModel(*spec, path); !s.ok()) return s;
  }
  (*made)[name] = path;
  return path;
}

inline std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& v : t) v = d(rng);
  return t;
}

// ||a − b|| / ||b|| over n values.
inline double RelativeL2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline int32_t Argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (v[i] > v[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

}  // namespace tandem::gpu_backend_testing

#endif  // TANDEM_TESTS_GPU_BACKEND_BACKEND_TEST_UTIL_H_
