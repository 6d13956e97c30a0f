#include "common/model_gen/gen_model_command.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// argv for ParseGenModelArgs / RunGenModelCommand; argv[0] = "gen-model".
class Argv {
 public:
  explicit Argv(std::vector<std::string> args) : args_(std::move(args)) {
    args_.insert(args_.begin(), "gen-model");
    for (std::string& a : args_) ptrs_.push_back(a.data());
  }
  int argc() { return static_cast<int>(ptrs_.size()); }
  char** argv() { return ptrs_.data(); }

 private:
  std::vector<std::string> args_;
  std::vector<char*> ptrs_;
};

absl::StatusOr<GenModelArgs> Parse(std::vector<std::string> args) {
  Argv a(std::move(args));
  return ParseGenModelArgs(a.argc(), a.argv());
}

TEST(ParseGenModelArgsTest, PresetFirstThenOverridesInAnyOrder) {
  absl::StatusOr<GenModelArgs> a =
      Parse({"--experts-type", "q2_k", "--preset=q3n-80b", "--out", "/tmp/x.gguf", "--seed=42",
             "--zipf", "1.1", "--dense-type", "Q4_0", "--head-type=q8_0", "--layers", "8",
             "--vocab=4096", "--tied-output"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->out, "/tmp/x.gguf");
  EXPECT_EQ(a->spec.h, 2048);  // from the preset
  EXPECT_EQ(a->spec.layers, 8);
  EXPECT_EQ(a->spec.vocab, 4096);
  EXPECT_EQ(a->spec.seed, 42u);
  EXPECT_DOUBLE_EQ(a->spec.zipf, 1.1);
  EXPECT_EQ(a->spec.expert_gate_up_type, WeightType::kQ2_K);
  EXPECT_EQ(a->spec.expert_down_type, WeightType::kQ2_K);
  EXPECT_EQ(a->spec.dense_type, WeightType::kQ4_0);
  EXPECT_EQ(a->spec.head_type, WeightType::kQ8_0);
  EXPECT_TRUE(a->spec.tied_output);

  absl::StatusOr<GenModelArgs> d = Parse({"--out=x", "--experts-down-type", "q6_k"});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->spec.name, "tandem-tiny");  // tiny is the default preset
  EXPECT_EQ(d->spec.expert_gate_up_type, WeightType::kQ4_K);
  EXPECT_EQ(d->spec.expert_down_type, WeightType::kQ6_K);

  absl::StatusOr<GenModelArgs> q3n = Parse({"--out=x", "--arch", "qwen3next"});
  ASSERT_TRUE(q3n.ok());
  EXPECT_EQ(q3n->spec.streams, 1);
  EXPECT_EQ(q3n->spec.idx_heads, 0);
  EXPECT_TRUE(q3n->spec.engram_layers.empty());
  EXPECT_TRUE(CheckGenModelSpec(q3n->spec).ok());

  absl::StatusOr<GenModelArgs> eng = Parse({"--out=x", "--engram-layers", "0,3,5"});
  ASSERT_TRUE(eng.ok());
  EXPECT_EQ(eng->spec.engram_layers, (std::vector<int64_t>{0, 3, 5}));
}

TEST(ParseGenModelArgsTest, BadFlagsGiveClearErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--out=x", "--bogus"}, "unknown flag --bogus"},
      {{"--out=x", "--seed"}, "--seed needs a value"},
      {{"--out=x", "--seed=abc"}, "--seed=abc: not an unsigned integer"},
      {{"--out=x", "--experts-type=q9_k"}, "--experts-type=q9_k: not a weight type"},
      {{"--out=x", "--preset=huge"}, "unknown preset 'huge'"},
      {{"--out=x", "--layers=-3"}, "--layers=-3: must be >= 1"},
      {{"--out=x", "--zipf=-1"}, "--zipf=-1: not a number >= 0"},
      {{"--out=x", "--arch=llama"}, "--arch=llama: must be qwen3next or qwen4exp"},
      {{"--out=x", "--quiet=yes"}, "--quiet takes no value"},
      {{"--out=x", "model.gguf"}, "unexpected argument 'model.gguf'"},
      {{"--engram-layers=1,x", "--out=x"}, "not a list of integers"},
      {{"--seed=3"}, "--out FILE is required"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<GenModelArgs> a = Parse(c.args);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(a.status().message(), HasSubstr(c.message));
  }
}

TEST(RunGenModelCommandTest, ExitCodes) {
  Argv bad({"--out=x", "--bogus"});
  EXPECT_EQ(RunGenModelCommand(bad.argc(), bad.argv()), 2);
  // A spec rule broken through flags: the checker names the field.
  Argv inconsistent({"--out=x", "--experts=2"});  // tiny uses K = 4
  EXPECT_EQ(RunGenModelCommand(inconsistent.argc(), inconsistent.argv()), 2);
  Argv help({"--help"});
  EXPECT_EQ(RunGenModelCommand(help.argc(), help.argv()), 0);
  EXPECT_THAT(GenModelUsage(), HasSubstr("--experts-type"));
  Argv dry({"--preset=q4x-80b", "--dry-run"});
  EXPECT_EQ(RunGenModelCommand(dry.argc(), dry.argv()), 0);
  Argv unwritable({"--preset=tiny-q3n", "--out=/nonexistent-dir/m.gguf", "--quiet"});
  EXPECT_EQ(RunGenModelCommand(unwritable.argc(), unwritable.argv()), 1);
}

TEST(RunGenModelCommandTest, WritesTheRequestedModel) {
  const std::string path = ::testing::TempDir() + "/gen_model_cmd_" + std::to_string(getpid()) + ".gguf";
  Argv a({"--preset", "tiny-q3n", "--out", path, "--layers=2", "--seed=9", "--quiet",
          "--experts-type=q2_k", "--vocab=512"});
  ASSERT_EQ(RunGenModelCommand(a.argc(), a.argv()), 0);
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*(*f)->GetU32("qwen3next.block_count"), 3u);
  EXPECT_EQ(*(*f)->GetU64("tandem.generator.seed"), 9u);
  EXPECT_EQ((*f)->FindTensor("token_embd.weight")->ne[1], 512);
  EXPECT_EQ((*f)->FindTensor("blk.1.ffn_up_exps.weight")->ggml_type,
            static_cast<uint32_t>(WeightType::kQ2_K));
  unlink(path.c_str());
}

}  // namespace
}  // namespace tandem
