// Decode's stream schedule (which stream runs a product, where the streams join) is a choice of
// order only: each kernel reads the same inputs and sums in the same order whatever the schedule,
// so a schedule switch must give bit-identical logits, in exact and fast mode, at batch 1 (the
// captured graphs of decode) and at a batch of three. Also the attention decode launches
// (TANDEM_OLD_ATTN_DECODE), which regroup the same operations. Skips without a GPU (CI).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gtest/gtest.h"
#include "tests/gpu_backend/backend_test_open.h"
#include "tests/gpu_backend/backend_test_util.h"

namespace tandem {
namespace {

using gpu_backend_testing::PresetModel;
using gpu_backend_testing::PresetTestName;
using gpu_backend_testing::RandomTokens;

// Logits of a prompt per sequence, then `steps` decode steps of all `batch` sequences together
// (tokens fixed by the step and the sequence), in one vector: the decode rows in order.
std::vector<float> DecodeLogits(const std::string& path, CudaMode mode, int batch, int steps) {
  CudaBackendOptions o;
  o.mode = mode;
  o.max_batch_tokens = 64;
  o.max_sequences = 4;
  o.max_context = 128;
  absl::StatusOr<std::unique_ptr<CudaBackend>> b = CudaBackend::Open(path, o);
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return {};
  CudaBackend& backend = **b;
  const int64_t V = backend.config().vocab;
  std::vector<SequenceSlot> seqs;
  std::vector<float> prompt_logits(static_cast<size_t>(V));
  for (int i = 0; i < batch; ++i) {
    absl::StatusOr<SequenceSlot> s = backend.CreateSequence();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return {};
    seqs.push_back(*s);
    const std::vector<int32_t> prompt = RandomTokens(17 + 5 * i, V, 90 + static_cast<uint32_t>(i));
    const Backend::StepInput in{*s, prompt, prompt_logits.data(), false};
    EXPECT_TRUE(backend.Step(std::span<const Backend::StepInput>(&in, 1)).ok());
  }
  std::vector<float> out(static_cast<size_t>(steps) * batch * V);
  std::vector<int32_t> toks(static_cast<size_t>(batch));
  for (int step = 0; step < steps; ++step) {
    std::vector<Backend::StepInput> in;
    for (int i = 0; i < batch; ++i) {
      toks[i] = static_cast<int32_t>((7 + 13 * step + 29 * i) % V);
      in.push_back({seqs[i], std::span<const int32_t>(&toks[i], 1),
                    out.data() + (static_cast<size_t>(step) * batch + i) * V, false});
    }
    const absl::Status s = backend.Step(in);
    EXPECT_TRUE(s.ok()) << s;
  }
  return out;
}

// Runs DecodeLogits with `set(false)` and with `set(true)` and expects the same bits (the caller
// restores the switch).
void ExpectScheduleChangesNoLogits(const std::string& preset, const char* what, const std::function<void(bool)>& set) {
  absl::StatusOr<std::string> path = PresetModel(preset);
  ASSERT_TRUE(path.ok()) << path.status();
  for (CudaMode mode : {CudaMode::kExact, CudaMode::kFast}) {
    for (int batch : {1, 3}) {
      std::vector<float> logits[2];
      for (int on = 0; on < 2; ++on) {
        set(on == 1);
        logits[on] = DecodeLogits(*path, mode, batch, 6);
      }
      ASSERT_EQ(logits[0].size(), logits[1].size());
      ASSERT_FALSE(logits[0].empty());
      const bool same = std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)) == 0;
      printf("[%s] %s decode, batch %d, %s: %s\n", preset.c_str(), mode == CudaMode::kExact ? "exact" : "fast", batch,
             what, same ? "bit-identical" : "DIFFERENT");
      EXPECT_TRUE(same) << what << ", batch " << batch;
    }
  }
}

class DecodeScheduleTest : public ::testing::TestWithParam<std::string> {};

// GDN layers: ba first on the side stream with the gates waiting for it alone and z after it
// (cuda::GdnDecodeOrder::kBaZ, the default), against z then ba under one join (kZBa).
TEST_P(DecodeScheduleTest, GdnProductOrdersGiveTheSameLogits) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const cuda::GdnDecodeOrder was = cuda::GetGdnDecodeOrder();
  ExpectScheduleChangesNoLogits(GetParam(), "GDN order z,ba vs ba,z", [](bool on) {
    cuda::SetGdnDecodeOrder(on ? cuda::GdnDecodeOrder::kBaZ : cuda::GdnDecodeOrder::kZBa);
  });
  cuda::SetGdnDecodeOrder(was);
}

// Attention layers: the q/k norm, RoPE and cache append in one launch after the q/k/v products, and
// the split attention's slices merged by their last block (the default), against QueryNormRope +
// KvAppend and the merge launch (TANDEM_OLD_ATTN_DECODE=1): the same operations in the same order.
TEST_P(DecodeScheduleTest, AttentionDecodeLaunchesGiveTheSameLogits) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const bool was = cuda::OldAttnDecode();
  ExpectScheduleChangesNoLogits(GetParam(), "attention decode one prep + in-block merge vs old launches",
                                [](bool on) { cuda::SetOldAttnDecode(!on); });
  cuda::SetOldAttnDecode(was);
}

INSTANTIATE_TEST_SUITE_P(Presets, DecodeScheduleTest, ::testing::Values("tiny-q3n", "small"), PresetTestName);

}  // namespace
}  // namespace tandem
