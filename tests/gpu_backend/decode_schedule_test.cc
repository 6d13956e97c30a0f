// Decode's stream schedule (which stream runs a product, where the streams join) is a choice of
// order only: each kernel reads the same inputs and sums in the same order whatever the schedule,
// so a schedule switch must give bit-identical logits, in exact and fast mode, at batch 1 (the
// captured graphs of decode) and at a batch of three. The stacked decode inputs (one product over
// GpuLayer::mixer_in instead of three) are a change of layout, not only of order: the stream
// kernel's split of a row depends on the matrix's row count, and ba alone is plain Q8_0, so their
// logits match the old layout's within a tolerance instead. Skips without a GPU (CI).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#include "gpu_service/backends/cuda/backend/device_model.h"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gtest/gtest.h"
#include "tests/gpu_backend/backend_test_open.h"
#include "tests/gpu_backend/backend_test_util.h"

namespace tandem {
namespace {

using gpu_backend_testing::MaxRowError;
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

// Runs DecodeLogits with `set(false)` and with `set(true)` and expects the same bits (tolerance 0)
// or rows of logits within `tolerance` relative L2 (the caller restores the switch).
void ExpectScheduleChangesNoLogits(const std::string& preset, const char* what, const std::function<void(bool)>& set,
                                   double tolerance = 0) {
  absl::StatusOr<std::string> path = PresetModel(preset);
  ASSERT_TRUE(path.ok()) << path.status();
  constexpr int kSteps = 6;
  for (CudaMode mode : {CudaMode::kExact, CudaMode::kFast}) {
    for (int batch : {1, 3}) {
      std::vector<float> logits[2];
      for (int on = 0; on < 2; ++on) {
        set(on == 1);
        logits[on] = DecodeLogits(*path, mode, batch, kSteps);
      }
      ASSERT_EQ(logits[0].size(), logits[1].size());
      ASSERT_FALSE(logits[0].empty());
      const bool same = std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)) == 0;
      const double err = MaxRowError(logits[1], logits[0], static_cast<int64_t>(logits[0].size() / (kSteps * batch)));
      printf("[%s] %s decode, batch %d, %s: %s (max row relative L2 %.3g)\n", preset.c_str(),
             mode == CudaMode::kExact ? "exact" : "fast", batch, what, same ? "bit-identical" : "DIFFERENT", err);
      if (tolerance == 0) {
        EXPECT_TRUE(same) << what << ", batch " << batch;
      } else {
        EXPECT_LE(err, tolerance) << what << ", batch " << batch;
      }
    }
  }
}

class DecodeScheduleTest : public ::testing::TestWithParam<std::string> {};

// GDN layers: ba first on the side stream with the gates waiting for it alone and z after it
// (cuda::GdnDecodeOrder::kBaZ, the default), against z then ba under one join (kZBa).
TEST_P(DecodeScheduleTest, GdnProductOrdersGiveTheSameLogits) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const cuda::GdnDecodeOrder was = cuda::GetGdnDecodeOrder();
  const bool stacked = cuda::StackedDecodeInputs();
  cuda::SetStackedDecodeInputs(false);  // the order is of the separate products' launches
  ExpectScheduleChangesNoLogits(GetParam(), "GDN order z,ba vs ba,z", [](bool on) {
    cuda::SetGdnDecodeOrder(on ? cuda::GdnDecodeOrder::kBaZ : cuda::GdnDecodeOrder::kZBa);
  });
  cuda::SetGdnDecodeOrder(was);
  cuda::SetStackedDecodeInputs(stacked);
}

// GDN and attention layers: the input products as one matrix-vector product over the stacked
// weights (cuda::StackedDecodeInputs, read at upload: each DecodeLogits opens its own backend)
// against the separate products of TANDEM_OLD_DECODE_INPUTS. Within 1e-5 (the f32 tolerance): the
// products differ in the last place (stacked_inputs_test.cc bounds them by 1e-6 per part), which
// the layers carry to the logits.
TEST_P(DecodeScheduleTest, StackedDecodeInputsGiveTheSameLogits) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const bool was = cuda::StackedDecodeInputs(), was_z = cuda::GdnStackedZSide(), was_kv = cuda::AttnStackedKvSide();
  cuda::SetGdnStackedZSide(false);  // one product over [z; qkv; ba], one over [q; k; v]
  cuda::SetAttnStackedKvSide(false);
  ExpectScheduleChangesNoLogits(
      GetParam(), "separate vs stacked decode inputs", [](bool on) { cuda::SetStackedDecodeInputs(on); }, 1e-5);
  cuda::SetAttnStackedKvSide(was_kv);
  cuda::SetGdnStackedZSide(was_z);
  cuda::SetStackedDecodeInputs(was);
}

// Stacked decode inputs with a part on the side stream: GDN's product over [qkv; ba] with z aside
// (cuda::GdnStackedZSide) and attention's q with [k; v] aside (cuda::AttnStackedKvSide), both read
// when a step is enqueued, against the one product per layer. Within 1e-5 like the test above (the
// products' rows may differ in the last place).
TEST_P(DecodeScheduleTest, StackedInputsWithPartsAsideGiveTheSameLogits) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const bool was = cuda::StackedDecodeInputs(), was_z = cuda::GdnStackedZSide(), was_kv = cuda::AttnStackedKvSide();
  cuda::SetStackedDecodeInputs(true);
  ExpectScheduleChangesNoLogits(
      GetParam(), "one stacked product vs z and [k; v] aside",
      [](bool on) {
        cuda::SetGdnStackedZSide(on);
        cuda::SetAttnStackedKvSide(on);
      },
      1e-5);
  cuda::SetAttnStackedKvSide(was_kv);
  cuda::SetGdnStackedZSide(was_z);
  cuda::SetStackedDecodeInputs(was);
}

INSTANTIATE_TEST_SUITE_P(Presets, DecodeScheduleTest, ::testing::Values("tiny-q3n", "small"), PresetTestName);

}  // namespace
}  // namespace tandem
