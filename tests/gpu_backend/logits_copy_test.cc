// The head's rows reach each input's logits straight from the device when the caller's buffer is
// page-locked (CudaBackend::Impl::EnqueueLogitsCopy), else through the backend's staging buffer:
// the same bits either way, for prefill rows of every position and for graph-replayed decode steps,
// with pinned and pageable inputs mixed in one step (adjacent pinned rows go in one copy, the
// others alone). HeadKernelWritesPinnedLogitsItself: the one-row Q6_K head kernel writing a pinned
// caller's row itself; FastHeadInt16KeepsLogitsClose: that kernel's int16 form in fast mode.
#include <cuda_runtime.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_gen/model_generator.h"
#include "common/model_gen/model_spec.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gtest/gtest.h"
#include "tests/gpu_backend/backend_test_open.h"
#include "tests/gpu_backend/backend_test_util.h"

namespace tandem {
namespace {

using gpu_backend_testing::OpenGpu;
using gpu_backend_testing::PresetModel;
using gpu_backend_testing::RandomTokens;

constexpr int kSeqs = 3;
constexpr int64_t kPrompt = 12;
constexpr int kDecodeSteps = 3;

// Every row the three sequences produce over one prefill (all positions) and kDecodeSteps decode
// steps, sequence by sequence; `pinned[i]` says whether sequence i's logits live in page-locked
// memory. Both buffers have one layout: the prefill rows of sequences 0, 1, 2 one after another (so
// that pinned neighbours take one copy, as their rows are neighbours in the head's output), then
// each decode step's rows in sequence order, while the decode steps put the sequences in the order
// 1, 0, 2 (neither their head rows nor their destinations adjacent).
std::vector<std::vector<float>> RunSteps(CudaBackend& b, const std::vector<std::vector<int32_t>>& prompts,
                                         const bool (&pinned)[kSeqs]) {
  const int64_t V = b.config().vocab;
  const size_t total = static_cast<size_t>(kSeqs * (kPrompt + kDecodeSteps) * V);
  absl::StatusOr<cuda::PinnedBuffer> pinned_buf = cuda::PinnedBuffer::Allocate(total * sizeof(float));
  EXPECT_TRUE(pinned_buf.ok()) << pinned_buf.status();
  if (!pinned_buf.ok()) return {};
  std::vector<float> pageable(total);
  auto base = [&](int i) { return pinned[i] ? pinned_buf->as<float>() : pageable.data(); };
  auto prefill_rows = [&](int i) { return base(i) + i * kPrompt * V; };
  auto decode_row = [&](int i, int step) { return base(i) + (kSeqs * kPrompt + step * kSeqs + i) * V; };
  std::vector<SequenceSlot> slots;
  for (int i = 0; i < kSeqs; ++i) {
    absl::StatusOr<SequenceSlot> s = b.CreateSequence();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return {};
    slots.push_back(*s);
  }
  std::vector<Backend::StepInput> in;
  for (int i = 0; i < kSeqs; ++i) in.push_back({slots[i], prompts[i], prefill_rows(i), true});
  const absl::Status prefill = b.Step(in);
  EXPECT_TRUE(prefill.ok()) << prefill;
  const int order[kSeqs] = {1, 0, 2};
  for (int step = 0; step < kDecodeSteps; ++step) {
    std::vector<int32_t> tokens(kSeqs);
    in.clear();
    for (int j = 0; j < kSeqs; ++j) {
      const int i = order[j];
      tokens[j] = static_cast<int32_t>((31 * i + 7 * step + 5) % V);
      in.push_back({slots[i], std::span<const int32_t>(&tokens[j], 1), decode_row(i, step), false});
    }
    const absl::Status s = b.Step(in);
    EXPECT_TRUE(s.ok()) << s;
  }
  std::vector<std::vector<float>> out(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    out[i].assign(prefill_rows(i), prefill_rows(i) + kPrompt * V);
    for (int step = 0; step < kDecodeSteps; ++step) {
      out[i].insert(out[i].end(), decode_row(i, step), decode_row(i, step) + V);
    }
  }
  for (SequenceSlot s : slots) b.ReleaseSequence(s);
  return out;
}

TEST(LogitsCopyTest, PinnedAndPageableLogitsGetTheSameBits) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  absl::StatusOr<std::string> path = PresetModel("tiny-q3n");
  ASSERT_TRUE(path.ok()) << path.status();
  std::unique_ptr<CudaBackend> b = OpenGpu(*path, CudaMode::kExact);
  ASSERT_NE(b, nullptr);
  const int64_t V = b->config().vocab;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kSeqs; ++i) prompts.push_back(RandomTokens(kPrompt, V, 40 + i));
  const bool none[kSeqs] = {false, false, false};
  const std::vector<std::vector<float>> want = RunSteps(*b, prompts, none);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSeqs));
  const bool mixes[][kSeqs] = {{false, true, true}, {true, true, true}, {true, false, true}};
  for (const auto& pinned : mixes) {
    const std::vector<std::vector<float>> got = RunSteps(*b, prompts, pinned);
    ASSERT_EQ(got.size(), static_cast<size_t>(kSeqs));
    for (int i = 0; i < kSeqs; ++i) {
      ASSERT_EQ(got[i].size(), want[i].size());
      EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0)
          << "sequence " << i << " (pinned " << pinned[0] << pinned[1] << pinned[2] << ")";
    }
  }
}

// tiny-q3n at h 2048 with a Q6_K head of 3001 rows, so that a step's one head row goes through the
// Q6_K head kernel; written to a temporary file named after `tag` ("" when generation fails).
std::string Head2048Model(const std::string& tag) {
  absl::StatusOr<GenModelSpec> spec = PresetSpec("tiny-q3n");
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return "";
  spec->name = "tandem-head2048";
  spec->h = 2048;
  spec->layers = 4;  // three GDN layers and one attention layer
  spec->vocab = 3001;
  spec->head_type = WeightType::kQ6_K;
  const std::string path = (std::filesystem::temp_directory_path() /
                            absl::StrCat("tandem-head2048-", tag, "-", getpid(), ".gguf")).string();
  const absl::Status s = GenerateModel(*spec, path);
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? path : "";
}

// A one-token step whose one head row goes through the Q6_K head kernel (h = 2048) has the kernel
// write the caller's page-locked row itself (CudaBackend::Impl::head_y_at, head_wrote_host) and
// reads x in place (no gather copy); a pageable caller gets the row through the copy after the
// head. Both give the bits of each other, eagerly and graph-replayed, for decode steps after a
// prefill of every position (which takes the other path), in exact and fast mode.
TEST(LogitsCopyTest, HeadKernelWritesPinnedLogitsItself) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const std::string path = Head2048Model("pinned");
  ASSERT_FALSE(path.empty());
  for (CudaMode mode : {CudaMode::kExact, CudaMode::kFast}) {
    for (bool graphs : {false, true}) {
      std::unique_ptr<CudaBackend> b = OpenGpu(path, mode, true, true, graphs);
      ASSERT_NE(b, nullptr);
      const int64_t V = b->config().vocab;
      ASSERT_EQ(b->config().h, 2048);
      const std::vector<int32_t> prompt = RandomTokens(kPrompt, V, 77);
      constexpr int kSteps = 4;
      // One sequence's rows: the prompt's, then each decode step's.
      auto run = [&](bool pinned) -> std::vector<float> {
        const size_t total = static_cast<size_t>((kPrompt + kSteps) * V);
        absl::StatusOr<cuda::PinnedBuffer> pinned_buf = cuda::PinnedBuffer::Allocate(total * sizeof(float));
        EXPECT_TRUE(pinned_buf.ok()) << pinned_buf.status();
        if (!pinned_buf.ok()) return {};
        std::vector<float> pageable(total);
        float* rows = pinned ? pinned_buf->as<float>() : pageable.data();
        std::memset(rows, 0xFF, total * sizeof(float));
        absl::StatusOr<SequenceSlot> slot = b->CreateSequence();
        EXPECT_TRUE(slot.ok()) << slot.status();
        if (!slot.ok()) return {};
        Backend::StepInput first{*slot, prompt, rows, true};
        EXPECT_TRUE(b->Step(std::span<const Backend::StepInput>(&first, 1)).ok());
        for (int step = 0; step < kSteps; ++step) {
          const int32_t token = static_cast<int32_t>((13 * step + 3) % V);
          Backend::StepInput in{*slot, std::span<const int32_t>(&token, 1), rows + (kPrompt + step) * V, false};
          const absl::Status s = b->Step(std::span<const Backend::StepInput>(&in, 1));
          EXPECT_TRUE(s.ok()) << s;
        }
        b->ReleaseSequence(*slot);
        return std::vector<float>(rows, rows + total);
      };
      const std::vector<float> pageable = run(false);
      const std::vector<float> pinned = run(true);
      const std::string what = absl::StrCat(mode == CudaMode::kExact ? "exact" : "fast", graphs ? ", graphs" : "");
      ASSERT_EQ(pinned.size(), pageable.size()) << what;
      for (int64_t r = 0; r < kPrompt + kSteps; ++r) {
        const float* p = pinned.data() + r * V;
        const float* q = pageable.data() + r * V;
        for (int64_t j = 0; j < V; ++j) ASSERT_TRUE(std::isfinite(p[j])) << what << ": row " << r << " entry " << j;
        if (mode == CudaMode::kExact) {
          EXPECT_EQ(std::memcmp(p, q, static_cast<size_t>(V) * sizeof(float)), 0) << what << ": row " << r;
        } else {
          // The fast mode's one-token MoE adds into y in no fixed order: the last bits may differ.
          double num = 0, den = 0;
          for (int64_t j = 0; j < V; ++j) {
            num += (static_cast<double>(p[j]) - q[j]) * (static_cast<double>(p[j]) - q[j]);
            den += static_cast<double>(q[j]) * q[j];
          }
          EXPECT_LE(std::sqrt(num / den), 1e-4) << what << ": row " << r;
        }
      }
    }
  }
  std::filesystem::remove(path);
}

// The fast mode's head in its int16 form (cuda::SetHeadInt16, the default) against the f32 form: a
// prefill whose last row alone is wanted (one head row: the head kernel) gives different bits
// within 1e-4 relative L2 (x's int16 rounding, ~1e-5), and so does every decode step after it (the
// fast one-token MoE adds in no fixed order, so those rows differ a little either way); the exact
// mode's head never takes the int16 form: bit-identical rows with the switch on or off.
TEST(LogitsCopyTest, FastHeadInt16KeepsLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const std::string path = Head2048Model("int16");
  ASSERT_FALSE(path.empty());
  const bool was = cuda::HeadInt16();
  constexpr int kSteps = 4;
  for (CudaMode mode : {CudaMode::kExact, CudaMode::kFast}) {
    std::vector<float> rows[2];
    int64_t V = 0;
    for (int on = 0; on < 2; ++on) {
      cuda::SetHeadInt16(on == 1);
      std::unique_ptr<CudaBackend> b = OpenGpu(path, mode);
      ASSERT_NE(b, nullptr);
      V = b->config().vocab;
      const std::vector<int32_t> prompt = RandomTokens(kPrompt, V, 91);
      rows[on].assign(static_cast<size_t>((1 + kSteps) * V), std::nanf(""));
      absl::StatusOr<SequenceSlot> slot = b->CreateSequence();
      ASSERT_TRUE(slot.ok()) << slot.status();
      Backend::StepInput first{*slot, prompt, rows[on].data(), false};
      ASSERT_TRUE(b->Step(std::span<const Backend::StepInput>(&first, 1)).ok());
      for (int step = 0; step < kSteps; ++step) {
        const int32_t token = static_cast<int32_t>((17 * step + 5) % V);
        Backend::StepInput in{*slot, std::span<const int32_t>(&token, 1), rows[on].data() + (1 + step) * V, false};
        const absl::Status s = b->Step(std::span<const Backend::StepInput>(&in, 1));
        ASSERT_TRUE(s.ok()) << s;
      }
      b->ReleaseSequence(*slot);
    }
    const char* m = mode == CudaMode::kExact ? "exact" : "fast";
    for (int r = 0; r <= kSteps; ++r) {
      const std::vector<float> off(rows[0].begin() + r * V, rows[0].begin() + (r + 1) * V);
      const std::vector<float> on(rows[1].begin() + r * V, rows[1].begin() + (r + 1) * V);
      const bool same = std::memcmp(off.data(), on.data(), off.size() * sizeof(float)) == 0;
      double num = 0.0, den = 0.0;
      for (int64_t j = 0; j < V; ++j) {
        ASSERT_TRUE(std::isfinite(on[j]) && std::isfinite(off[j])) << m << ": row " << r << " entry " << j;
        num += (static_cast<double>(on[j]) - off[j]) * (static_cast<double>(on[j]) - off[j]);
        den += static_cast<double>(off[j]) * off[j];
      }
      const double err = std::sqrt(num / den);
      printf("%s, row %d (%s): int16 head against f32, relative L2 %.3g%s\n", m, r, r == 0 ? "prefill" : "decode",
             err, same ? " (bit-identical)" : "");
      if (mode == CudaMode::kExact) {
        EXPECT_TRUE(same) << "exact mode, row " << r << ": the switch changed the exact head";
      } else {
        if (r == 0) {
          EXPECT_FALSE(same) << "fast prefill's head row: the int16 form did not run";
        }
        EXPECT_LE(err, 1e-4) << "fast mode, row " << r;
      }
    }
  }
  cuda::SetHeadInt16(was);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tandem
