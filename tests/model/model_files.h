// Generated models shared by the model tests: written once per test binary into a temp folder.
#ifndef TANDEM_TESTS_MODEL_MODEL_FILES_H_
#define TANDEM_TESTS_MODEL_MODEL_FILES_H_

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "common/model_gen/model_generator.h"
#include "common/model_gen/model_spec.h"
#include "gtest/gtest.h"

namespace tandem {

// The path of a generated preset (generated on first use; the folder is removed at exit).
inline std::string GeneratedModel(const std::string& preset) {
  static std::map<std::string, std::string> paths;
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = std::filesystem::temp_directory_path() /
                              ("tandem-model-test-" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                      ("tandem-model-test-" + std::to_string(getpid())),
                                  ec);
    });
    return d;
  }();
  auto it = paths.find(preset);
  if (it != paths.end()) return it->second;
  absl::StatusOr<GenModelSpec> spec = PresetSpec(preset);
  EXPECT_TRUE(spec.ok()) << spec.status();
  const std::string path = (dir / (preset + ".gguf")).string();
  absl::Status s = GenerateModel(*spec, path);
  EXPECT_TRUE(s.ok()) << s;
  paths[preset] = path;
  return path;
}

// ‖a − b‖ / ‖b‖ over n floats.
inline double RelativeL2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace tandem

#endif  // TANDEM_TESTS_MODEL_MODEL_FILES_H_
