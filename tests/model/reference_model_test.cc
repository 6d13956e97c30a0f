// The CPU reference engine end to end on generated models (issue "The model", acceptance).
#include "common/model/reference_model.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/gguf/gguf_writer.h"
#include "common/model/sampler.h"
#include "gtest/gtest.h"
#include "tests/model/model_files.h"

namespace tandem {
namespace {

std::unique_ptr<ReferenceModel> OpenModel(const std::string& path, GdnMode prefill_mode) {
  ReferenceModelOptions options;
  options.threads = 2;
  options.prefill_gdn_mode = prefill_mode;
  absl::StatusOr<std::unique_ptr<ReferenceModel>> m = ReferenceModel::Open(path, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// A prompt long enough for the indexer of `tiny` to select blocks sparsely.
std::vector<int32_t> TestPrompt(const ReferenceModel& m, int n) {
  std::vector<int32_t> ids = m.tokenizer().Encode(
      "The quick brown fox jumps over the lazy dog. Tandem serves mixture-of-experts models that "
      "are larger than the GPU, with a host worker computing the experts the GPU does not hold. "
      "int main() { return 0; } 12345 + 678 = 13023; the end of the test prompt, repeated: ",
      false);
  while (static_cast<int>(ids.size()) < n) ids.push_back(ids[ids.size() % 97]);
  ids.resize(n);
  return ids;
}

// Prefill of the whole prompt (all positions' logits) against a prefix prefill followed by
// one-token decode steps: the same logits at every position.
void CheckPrefillEqualsDecode(const std::string& preset, GdnMode prefill_mode, int n, int prefix) {
  std::unique_ptr<ReferenceModel> m = OpenModel(GeneratedModel(preset), prefill_mode);
  ASSERT_NE(m, nullptr);
  const int64_t V = m->config().vocab;
  const std::vector<int32_t> prompt = TestPrompt(*m, n);

  auto whole = m->NewSequence();
  ASSERT_TRUE(whole.ok());
  std::vector<float> all(n * V);
  ReferenceModel::Step step{whole->get(), prompt, all.data(), true};
  ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());

  auto split = m->NewSequence();
  ASSERT_TRUE(split.ok());
  std::vector<float> part(prefix * V);
  step = {split->get(), std::span(prompt).first(prefix), part.data(), true};
  ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
  for (int p = 0; p < prefix; ++p) {
    EXPECT_LE(RelativeL2(part.data() + p * V, all.data() + p * V, V), 1e-4) << "position " << p;
  }
  std::vector<float> one(V);
  for (int p = prefix; p < n; ++p) {
    step = {split->get(), std::span(prompt).subspan(p, 1), one.data(), false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
    EXPECT_LE(RelativeL2(one.data(), all.data() + p * V, V), 1e-4) << preset << " position " << p;
  }
}

TEST(ReferenceModelTest, PrefillEqualsDecodeTiny) {
  CheckPrefillEqualsDecode("tiny", GdnMode::kChunked, 96, 40);
}

TEST(ReferenceModelTest, PrefillEqualsDecodeTinyQ3n) {
  CheckPrefillEqualsDecode("tiny-q3n", GdnMode::kChunked, 80, 33);
}

TEST(ReferenceModelTest, RecurrentPrefillEqualsDecodeTiny) {
  CheckPrefillEqualsDecode("tiny", GdnMode::kRecurrent, 48, 17);
}

// One step per part, each on a new sequence (kept in *seqs) writing its logits into (*outputs)[i].
std::vector<ReferenceModel::Step> BatchSteps(ReferenceModel& m, const std::vector<std::span<const int32_t>>& parts,
                                             std::vector<std::unique_ptr<SequenceState>>* seqs,
                                             std::vector<std::vector<float>>* outputs) {
  outputs->assign(parts.size(), std::vector<float>(static_cast<size_t>(m.config().vocab)));
  std::vector<ReferenceModel::Step> steps;
  for (size_t i = 0; i < parts.size(); ++i) {
    seqs->push_back(*m.NewSequence());
    steps.push_back({seqs->back().get(), parts[i], (*outputs)[i].data(), false});
  }
  return steps;
}

// A batch of several sequences gives each the logits it gets alone.
TEST(ReferenceModelTest, BatchEqualsSolo) {
  std::unique_ptr<ReferenceModel> m = OpenModel(GeneratedModel("tiny"), GdnMode::kChunked);
  ASSERT_NE(m, nullptr);
  const int64_t V = m->config().vocab;
  const std::vector<int32_t> prompt = TestPrompt(*m, 40);
  const std::vector<std::span<const int32_t>> parts = {std::span(prompt).first(7),
                                                       std::span(prompt).subspan(7, 20),
                                                       std::span(prompt).subspan(27, 1)};
  std::vector<std::vector<float>> solo(parts.size(), std::vector<float>(V));
  for (size_t i = 0; i < parts.size(); ++i) {
    auto seq = m->NewSequence();
    ReferenceModel::Step step{seq->get(), parts[i], solo[i].data(), false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
  }
  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<std::vector<float>> batched;
  std::vector<ReferenceModel::Step> steps = BatchSteps(*m, parts, &seqs, &batched);
  ASSERT_TRUE(m->Forward(std::span(steps)).ok());
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_LE(RelativeL2(batched[i].data(), solo[i].data(), V), 1e-5) << "sequence " << i;
  }
}

// ForwardOptions::selections: per attention layer with an indexer, keep ids and a count per token
// of the batch (step order), the same selections as each sequence alone; the other layers empty
// (all of them for tiny-q3n, which has no indexer); the logits the same as without the sink.
TEST(ReferenceModelTest, SelectionSinkReportsEachLayersBlocksAndChangesNothing) {
  for (const char* preset : {"tiny", "tiny-q3n"}) {
    std::unique_ptr<ReferenceModel> m = OpenModel(GeneratedModel(preset), GdnMode::kChunked);
    ASSERT_NE(m, nullptr);
    const ModelConfig& c = m->config();
    const int64_t V = c.vocab;
    const std::vector<int32_t> prompt = TestPrompt(*m, 90);
    // Two fresh sequences (each from position 0): 70 tokens (sparse from position 40 on tiny) and 20.
    const std::vector<std::span<const int32_t>> parts = {std::span(prompt).first(70), std::span(prompt).subspan(70)};
    ReferenceModel::ForwardOptions fo;
    std::vector<std::vector<BlockSelection>> solo(parts.size());
    std::vector<std::vector<float>> plain(parts.size(), std::vector<float>(V)), with(parts.size(), std::vector<float>(V));
    for (size_t i = 0; i < parts.size(); ++i) {
      auto a = m->NewSequence();
      auto b = m->NewSequence();
      ASSERT_TRUE(a.ok() && b.ok());
      ReferenceModel::Step step{a->get(), parts[i], plain[i].data(), false};
      ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
      step = {b->get(), parts[i], with[i].data(), false};
      fo.selections = &solo[i];
      ASSERT_TRUE(m->Forward(std::span(&step, 1), fo).ok());
      EXPECT_EQ(with[i], plain[i]) << preset << " sequence " << i;
    }
    std::vector<std::unique_ptr<SequenceState>> seqs;
    std::vector<std::vector<float>> batched;
    std::vector<ReferenceModel::Step> steps = BatchSteps(*m, parts, &seqs, &batched);
    std::vector<BlockSelection> sel;
    fo.selections = &sel;
    ASSERT_TRUE(m->Forward(std::span(steps), fo).ok());
    ASSERT_EQ(sel.size(), static_cast<size_t>(c.n_layers));
    const int64_t T = static_cast<int64_t>(prompt.size());
    int64_t indexed = 0;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const BlockSelection& s = sel[l];
      if (c.is_gdn(l) || !c.attn.has_indexer()) {
        EXPECT_TRUE(s.blocks.empty() && s.counts.empty() && s.keep == 0) << preset << " layer " << l;
        continue;
      }
      ++indexed;
      ASSERT_EQ(s.keep, c.attn.keep);
      ASSERT_EQ(s.counts.size(), static_cast<size_t>(T));
      ASSERT_EQ(s.blocks.size(), static_cast<size_t>(T * s.keep));
      int64_t off = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        for (int64_t t = 0; t < static_cast<int64_t>(parts[i].size()); ++t) {
          const std::span<const int32_t> got = s.of(off + t);
          const std::span<const int32_t> want = solo[i][l].of(t);
          EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end())) << preset << " layer " << l;
          EXPECT_EQ(got.size(), static_cast<size_t>(std::min<int64_t>(t / c.attn.cr, c.attn.keep)));
          EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
        }
        off += static_cast<int64_t>(parts[i].size());
      }
    }
    if (std::string(preset) == "tiny") {
      EXPECT_GT(indexed, 0) << "tiny has sparse attention";
    }
  }
}

// Advance t1..t5, keep the first 2, advance t3..t5 again: the state and the next logits equal
// those of advancing t1..t5 once.
TEST(ReferenceModelTest, KeepFirstRestoresState) {
  for (const char* preset : {"tiny", "tiny-q3n"}) {
    std::unique_ptr<ReferenceModel> m = OpenModel(GeneratedModel(preset), GdnMode::kRecurrent);
    ASSERT_NE(m, nullptr);
    const int64_t V = m->config().vocab;
    const std::vector<int32_t> prompt = TestPrompt(*m, 12);
    const std::span<const int32_t> head = std::span(prompt).first(7), t = std::span(prompt).subspan(7, 5);

    auto once = m->NewSequence();
    std::vector<float> ref(V), got(V);
    ReferenceModel::Step step{once->get(), head, nullptr, false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
    step = {once->get(), t, ref.data(), false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());

    auto twice = m->NewSequence();
    step = {twice->get(), head, nullptr, false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
    step = {twice->get(), t, nullptr, false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
    ASSERT_TRUE(m->KeepFirst(twice->get(), 2).ok());
    EXPECT_EQ((*twice)->length(), 9);
    step = {twice->get(), t.subspan(2), got.data(), false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
    EXPECT_LE(RelativeL2(got.data(), ref.data(), V), 1e-5) << preset;

    // The recurrent state itself: every GDN layer's S and conv history.
    for (int64_t layer = 0; layer < m->config().n_layers; ++layer) {
      if (!m->config().is_gdn(layer)) continue;
      const GdnDims& d = m->config().gdn;
      GdnState a = (*once)->gdn(layer), b = (*twice)->gdn(layer);
      EXPECT_LE(RelativeL2(b.ssm, a.ssm, d.ssm_state_floats()), 1e-5) << preset << " layer " << layer;
      EXPECT_LE(RelativeL2(b.conv, a.conv, d.conv_state_floats()), 1e-6) << preset << " layer " << layer;
    }
    EXPECT_FALSE(m->KeepFirst(twice->get(), 7).ok());
  }
}

// A qwen4exp file with one stream, no indexer and no Engram computes exactly what the qwen3next
// file with the same weights computes: the same tensors under the other architecture's keys.
TEST(ReferenceModelTest, Qwen4expWithoutExtrasEqualsQwen3next) {
  const std::string q3n = GeneratedModel("tiny-q3n");
  auto file = GgufFile::Open(q3n);
  ASSERT_TRUE(file.ok());
  const std::string q4x = q3n + ".as-qwen4exp.gguf";
  {
    auto w = GgufWriter::Create(q4x);
    ASSERT_TRUE(w.ok());
    for (const GgufMetadataEntry& e : (*file)->metadata()) {
      std::string key = e.key;
      GgufValue value = e.value;
      if (key == "general.architecture") value = GgufValue::String("qwen4exp");
      if (key.rfind("qwen3next.", 0) == 0) key = "qwen4exp." + key.substr(10);
      if (key == "general.alignment") continue;
      ASSERT_TRUE((*w)->AddMetadata(key, value).ok()) << key;
    }
    for (const GgufTensorInfo& t : (*file)->tensors()) {
      ASSERT_TRUE((*w)->AddTensor(t.name, t.ggml_type, absl::MakeConstSpan(t.ne.data(), t.n_dims)).ok());
    }
    for (const GgufTensorInfo& t : (*file)->tensors()) {
      ASSERT_TRUE((*w)->WriteTensorData(t.name, t.data).ok());
    }
    ASSERT_TRUE((*w)->Finish().ok());
  }
  std::unique_ptr<ReferenceModel> a = OpenModel(q3n, GdnMode::kChunked);
  std::unique_ptr<ReferenceModel> b = OpenModel(q4x, GdnMode::kChunked);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->config().arch, "qwen4exp");
  const int64_t V = a->config().vocab;
  const std::vector<int32_t> prompt = TestPrompt(*a, 30);
  std::vector<float> la(30 * V), lb(30 * V);
  auto sa = a->NewSequence();
  auto sb = b->NewSequence();
  ReferenceModel::Step step{sa->get(), prompt, la.data(), true};
  ASSERT_TRUE(a->Forward(std::span(&step, 1)).ok());
  step = {sb->get(), prompt, lb.data(), true};
  ASSERT_TRUE(b->Forward(std::span(&step, 1)).ok());
  EXPECT_EQ(la, lb);
}

// The MTP head drafts deterministically and leaves the main model's state alone.
TEST(ReferenceModelTest, MtpDraftLeavesMainStateAlone) {
  for (const char* preset : {"tiny", "tiny-q3n"}) {
    std::unique_ptr<ReferenceModel> m = OpenModel(GeneratedModel(preset), GdnMode::kChunked);
    ASSERT_NE(m, nullptr);
    ASSERT_EQ(m->config().nextn, 1) << preset;
    const int64_t V = m->config().vocab;
    const std::vector<int32_t> prompt = TestPrompt(*m, 20);
    auto seq = m->NewSequence();
    std::vector<float> logits(V), after(V), ref(V);
    ReferenceModel::Step step{seq->get(), std::span(prompt).first(19), logits.data(), false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
    absl::StatusOr<std::vector<int32_t>> d1 = m->DraftGreedy(seq->get(), prompt[19], 3);
    ASSERT_TRUE(d1.ok()) << d1.status();
    EXPECT_EQ(d1->size(), 3u);
    for (int32_t t : *d1) EXPECT_TRUE(t >= 0 && t < V);
    step = {seq->get(), std::span(prompt).subspan(19, 1), after.data(), false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());

    auto plain = m->NewSequence();
    step = {plain->get(), prompt, ref.data(), false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
    EXPECT_LE(RelativeL2(after.data(), ref.data(), V), 1e-4) << preset;

    // The same draft from a fresh sequence in the same state.
    auto again = m->NewSequence();
    step = {again->get(), std::span(prompt).first(19), nullptr, false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
    absl::StatusOr<std::vector<int32_t>> d2 = m->DraftGreedy(again->get(), prompt[19], 3);
    ASSERT_TRUE(d2.ok());
    EXPECT_EQ(*d1, *d2) << preset;
  }
}

// Pages go back to the pool when sequences die.
TEST(ReferenceModelTest, StatePagesReturnToPool) {
  std::unique_ptr<ReferenceModel> m = OpenModel(GeneratedModel("tiny"), GdnMode::kChunked);
  ASSERT_NE(m, nullptr);
  const int64_t idle = m->state_pool().pages_in_use();
  {
    auto seq = m->NewSequence();
    const std::vector<int32_t> prompt = TestPrompt(*m, 150);
    ReferenceModel::Step step{seq->get(), prompt, nullptr, false};
    ASSERT_TRUE(m->Forward(std::span(&step, 1)).ok());
    EXPECT_GT(m->state_pool().pages_in_use(), idle);
  }
  EXPECT_EQ(m->state_pool().pages_in_use(), idle);
}

}  // namespace
}  // namespace tandem
