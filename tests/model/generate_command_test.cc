// `tandem generate`: bad flags refused before the model opens, each named; a greedy run's ids.
#include "common/model/generate_command.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/model/model_files.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

struct CommandRun {
  int code;
  std::string out, err;
};

CommandRun Generate(std::vector<std::string> args) {
  args.insert(args.begin(), "generate");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int code = RunGenerateCommand(static_cast<int>(argv.size()), argv.data());
  CommandRun r{code, testing::internal::GetCapturedStdout(), testing::internal::GetCapturedStderr()};
  return r;
}

TEST(GenerateCommandTest, NamesEachBadFlagBeforeOpeningTheModel) {
  // The model does not exist: a flag error must come first.
  const std::vector<std::string> base = {"--model", "/no/such/model.gguf", "--prompt", "Hi"};
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-n", "0"}, "-n: need >= 1"},
      {{"--temperature", "nan"}, "--temperature: need a finite value >= 0"},
      {{"--temperature", "inf"}, "--temperature: need a finite value >= 0"},
      {{"--temperature", "-1"}, "--temperature: need a finite value >= 0"},
      {{"--top-k", "-3"}, "--top-k: need >= 0"},
      {{"--top-p", "nan"}, "--top-p: need a value in (0, 1]"},
      {{"--top-p", "1.5"}, "--top-p: need a value in (0, 1]"},
      {{"--threads", "-1"}, "--threads: need >= 0"},
  };
  for (const auto& [extra, message] : cases) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandRun r = Generate(args);
    EXPECT_EQ(r.code, 2) << extra[0] << " " << extra[1];
    EXPECT_THAT(r.err, HasSubstr(message)) << extra[0] << " " << extra[1];
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("/no/such/model.gguf")));
  }
  const CommandRun missing = Generate(base);
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.err, HasSubstr("/no/such/model.gguf"));
}

TEST(GenerateCommandTest, GreedyRunPrintsItsIds) {
  const CommandRun r = Generate({"--model", GeneratedModel("tiny"), "--prompt", "Hello", "-n", "4",
                          "--ids", "--threads", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("prompt_ids: "));
  const size_t at = r.out.find("generated_ids: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::string ids = r.out.substr(at + 15);
  int count = 0;
  for (size_t i = 0; i < ids.size() && ids[i] != '\n'; ++i) count += ids[i] == ' ' ? 1 : 0;
  EXPECT_LE(count + 1, 4);  // at most -n ids (fewer only after an EOS)
  EXPECT_THAT(r.err, HasSubstr("prefill: "));
}

}  // namespace
}  // namespace tandem
