// Model configuration and weight binding: every problem reported at once, each named.
#include "common/model/model_config.h"

#include "common/gguf/gguf_writer.h"
#include "common/model/model_weights.h"
#include "gtest/gtest.h"
#include "tests/model/model_files.h"

namespace tandem {
namespace {

TEST(ModelConfigTest, ReadsGeneratedPresets) {
  for (const char* preset : {"tiny", "tiny-q3n"}) {
    auto file = GgufFile::Open(GeneratedModel(preset));
    ASSERT_TRUE(file.ok());
    absl::StatusOr<ModelConfig> c = ReadModelConfig(**file);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(BindModelWeights(**file, *c).ok());
    EXPECT_EQ(c->nextn, 1);
    EXPECT_EQ(static_cast<int64_t>(c->layer_kinds.size()), c->n_layers + 1);
  }
  auto file = GgufFile::Open(GeneratedModel("tiny"));
  absl::StatusOr<ModelConfig> c = ReadModelConfig(**file);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->arch, "qwen4exp");
  EXPECT_EQ(c->n_streams, 4);
  EXPECT_TRUE(c->attn.has_indexer());
  EXPECT_EQ(c->engram.size(), 2u);
}

// A file with several keys missing or wrong lists every one of them.
TEST(ModelConfigTest, ReportsEveryProblemAtOnce) {
  const std::string path = testing::TempDir() + "/bad-config.gguf";
  {
    auto w = GgufWriter::Create(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AddMetadata("general.architecture", GgufValue::String("qwen3next")).ok());
    ASSERT_TRUE((*w)->AddMetadata("qwen3next.embedding_length", GgufValue::Scalar<uint32_t>(64)).ok());
    ASSERT_TRUE((*w)->AddMetadata("qwen3next.block_count", GgufValue::Scalar<uint32_t>(4)).ok());
    ASSERT_TRUE((*w)->AddMetadata("qwen3next.attention.head_count", GgufValue::Scalar<uint32_t>(6)).ok());
    ASSERT_TRUE((*w)->AddMetadata("qwen3next.attention.head_count_kv", GgufValue::Scalar<uint32_t>(4)).ok());
    ASSERT_TRUE((*w)->AddMetadata("qwen3next.expert_count", GgufValue::Scalar<uint32_t>(4)).ok());
    ASSERT_TRUE((*w)->AddMetadata("qwen3next.expert_used_count", GgufValue::Scalar<uint32_t>(8)).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  absl::StatusOr<ModelConfig> c = ReadModelConfig(**file);
  ASSERT_FALSE(c.ok());
  const std::string msg(c.status().message());
  for (const char* expected :
       {"qwen3next.attention.layer_norm_rms_epsilon", "qwen3next.attention.key_length",
        "qwen3next.full_attention_interval", "qwen3next.expert_feed_forward_length",
        "is not a multiple of qwen3next.attention.head_count_kv",
        "qwen3next.expert_used_count = 8 exceeds", "token_embd.weight' is missing"}) {
    EXPECT_NE(msg.find(expected), std::string::npos) << "missing '" << expected << "' in:\n" << msg;
  }
}

TEST(ModelConfigTest, RefusesOtherArchitectures) {
  const std::string path = testing::TempDir() + "/llama.gguf";
  {
    auto w = GgufWriter::Create(path);
    ASSERT_TRUE((*w)->AddMetadata("general.architecture", GgufValue::String("llama")).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  auto file = GgufFile::Open(path);
  absl::StatusOr<ModelConfig> c = ReadModelConfig(**file);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'llama'"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace tandem
