// The CUDA backend's per-stage time breakdown (not a test: timing never decides a test). For each
// preset named on the command line (default: tiny small) and each mode, prints the stage line of a
// 512-token prefill and the mean stage times of 64 batch-1 decode steps, and of 32 steps of a batch
// of 8 sequences.
//
//   gpu_backend_profile [preset...]    (models from $TANDEM_GPU_BACKEND_MODELS or a temp dir)
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#include "gpu_service/backends/cuda/backend/stage_timer.h"
#include "tests/gpu_backend/backend_test_util.h"

namespace tandem {
namespace {

// Parses "... name=value ..." back into per-stage sums (the only channel the backend offers).
void Accumulate(const std::string& line, std::vector<double>& sums, double& total) {
  for (int i = 0; i < cuda::kStageCount; ++i) {
    const std::string key = std::string(" ") + cuda::StageName(static_cast<cuda::Stage>(i)) + "=";
    const size_t p = line.find(key);
    if (p != std::string::npos) sums[i] += std::stod(line.substr(p + key.size()));
  }
  const size_t p = line.find("total=");
  if (p != std::string::npos) total += std::stod(line.substr(p + 6));
}

int Profile(const std::string& preset, CudaMode mode) {
  absl::StatusOr<std::string> path = gpu_backend_testing::PresetModel(preset);
  if (!path.ok()) {
    fprintf(stderr, "%s: %s\n", preset.c_str(), path.status().ToString().c_str());
    return 1;
  }
  CudaBackendOptions o;
  o.mode = mode;
  o.max_batch_tokens = 512;
  o.max_sequences = 8;
  o.max_context = 1024;
  o.profile = true;
  absl::StatusOr<std::unique_ptr<CudaBackend>> b = CudaBackend::Open(*path, o);
  if (!b.ok()) {
    fprintf(stderr, "%s: %s\n", preset.c_str(), b.status().ToString().c_str());
    return 1;
  }
  CudaBackend& g = **b;
  const char* mname = mode == CudaMode::kExact ? "exact" : "fast";
  const int64_t V = g.config().vocab;
  printf("== %s %s: weights %.1f MiB, state+scratch %.1f MiB\n", preset.c_str(), mname, g.weight_bytes() / 1048576.0,
         g.state_bytes() / 1048576.0);
  std::vector<SequenceSlot> slots;
  for (int i = 0; i < 8; ++i) slots.push_back(*g.CreateSequence());
  std::vector<float> logits(8 * V);
  const std::vector<int32_t> prompt = gpu_backend_testing::RandomTokens(512, V, 3);
  for (int rep = 0; rep < 2; ++rep) {
    // rep 0 warms up on slot 7; rep 1 is measured on slot 0.
    const SequenceSlot s = rep == 0 ? slots[7] : slots[0];
    Backend::StepInput in{s, prompt, logits.data(), false};
    if (absl::Status st = g.Step(std::span<const Backend::StepInput>(&in, 1)); !st.ok()) {
      fprintf(stderr, "prefill: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  printf("prefill 512: %s\n", g.last_profile().c_str());
  for (int batch : {1, 8}) {
    if (batch == 8) {
      for (int i = 1; i < 8; ++i) {
        Backend::StepInput in{slots[i], std::span<const int32_t>(prompt.data(), 64), nullptr, false};
        if (i == 7) continue;  // slot 7 already holds the warm-up prefill
        if (absl::Status st = g.Step(std::span<const Backend::StepInput>(&in, 1)); !st.ok()) return 1;
      }
    }
    std::vector<double> sums(cuda::kStageCount, 0.0);
    double total = 0;
    const int steps = batch == 1 ? 64 : 32;
    for (int step = 0; step < steps; ++step) {
      std::vector<int32_t> toks(batch);
      std::vector<Backend::StepInput> ins;
      for (int i = 0; i < batch; ++i) {
        toks[i] = gpu_backend_testing::Argmax(logits.data() + i * V, V);
      }
      for (int i = 0; i < batch; ++i) {
        ins.push_back({slots[i], std::span<const int32_t>(&toks[i], 1), logits.data() + i * V, false});
      }
      if (absl::Status st = g.Step(ins); !st.ok()) {
        fprintf(stderr, "decode: %s\n", st.ToString().c_str());
        return 1;
      }
      if (step > 0) Accumulate(g.last_profile(), sums, total);  // step 0 is a warm-up
    }
    std::string line = absl::StrFormat("decode batch %d, mean of %d steps: total=%.3f ms (%.1f tokens/s)", batch,
                                       steps - 1, total / (steps - 1), 1000.0 * batch * (steps - 1) / total);
    for (int i = 0; i < cuda::kStageCount; ++i) {
      line += absl::StrFormat(" %s=%.3f", cuda::StageName(static_cast<cuda::Stage>(i)), sums[i] / (steps - 1));
    }
    printf("%s\n", line.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  if (std::string r = tandem::gpu_backend_testing::NoGpuReason(); !r.empty()) {
    printf("gpu_backend_profile: skipped: %s\n", r.c_str());
    return 0;
  }
  std::vector<std::string> presets;
  for (int i = 1; i < argc; ++i) presets.push_back(argv[i]);
  if (presets.empty()) presets = {"tiny", "small"};
  int rc = 0;
  for (const std::string& p : presets) {
    for (tandem::CudaMode m : {tandem::CudaMode::kExact, tandem::CudaMode::kFast}) rc |= tandem::Profile(p, m);
  }
  return rc;
}
