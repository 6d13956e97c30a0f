// `tandem inspect` on a small file: the text report, the --json report (checked to be valid
// JSON by a small strict parser below), and the exit codes for a bad file and bad usage.
#include <unistd.h>

#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "common/gguf/inspect_command.h"
#include "common/gguf/inspect_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// A strict recursive-descent check of RFC 8259 JSON; true when `s` is exactly one JSON value.
class JsonChecker {
 public:
  explicit JsonChecker(const std::string& s) : s_(s) {}
  bool Valid() {
    SkipSpace();
    if (!Value()) return false;
    SkipSpace();
    return i_ == s_.size();
  }

 private:
  void SkipSpace() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool Eat(char c) {
    SkipSpace();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool Literal(const char* word) {
    const std::string w(word);
    if (s_.compare(i_, w.size(), w) != 0) return false;
    i_ += w.size();
    return true;
  }
  bool String() {
    if (!Eat('"')) return false;
    while (i_ < s_.size()) {
      const unsigned char c = s_[i_++];
      if (c == '"') return true;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (i_ >= s_.size()) return false;
        const char e = s_[i_++];
        if (e == 'u') {
          for (int k = 0; k < 4; ++k) {
            if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_++]))) return false;
          }
        } else if (std::string("\"\\/bfnrt").find(e) == std::string::npos) {
          return false;
        }
      }
    }
    return false;
  }
  bool Number() {
    const size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) return false;
    if (s_[i_] == '0' && i_ + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_ + 1]))) return false;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) return false;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) return false;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    return i_ > start;
  }
  bool Value() {
    SkipSpace();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      if (Eat('}')) return true;
      do {
        if (!String() || !Eat(':') || !Value()) return false;
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      ++i_;
      if (Eat(']')) return true;
      do {
        if (!Value()) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') return String();
    if (c == 't') return Literal("true");
    if (c == 'f') return Literal("false");
    if (c == 'n') return Literal("null");
    return Number();
  }

  const std::string& s_;
  size_t i_ = 0;
};

class InspectCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/inspect_test_", ::getpid(), ".gguf");
    auto w = *GgufWriter::Create(path_, {.alignment = 64});
    ASSERT_TRUE(w->AddMetadata("general.architecture", GgufValue::String("qwen3next")).ok());
    ASSERT_TRUE(w->AddMetadata("qwen3next.block_count", GgufValue::Scalar<uint32_t>(48)).ok());
    ASSERT_TRUE(w->AddMetadata("qwen3next.rope.freq_base", GgufValue::Scalar<float>(1e7f)).ok());
    ASSERT_TRUE(w->AddMetadata("nan", GgufValue::Scalar<float>(std::nanf(""))).ok());
    ASSERT_TRUE(w->AddMetadata("tokenizer.ggml.tokens",
                               GgufValue::StringArray({"a", "\"q\"", "\n", "\xff", "e", "f", "g", "h", "i", "j"}))
                    .ok());
    ASSERT_TRUE(w->AddMetadata("nested", GgufValue::ArrayOfArrays({GgufValue::Array(std::vector<int32_t>{1, -2})}))
                    .ok());
    ASSERT_TRUE(w->AddTensor("token_embd.weight", 8, {64, 3}).ok());   // q8_0: 2 blocks x 34 x 3 = 204
    ASSERT_TRUE(w->AddTensor("output_norm.weight", 0, {64}).ok());     // f32: 256
    ASSERT_TRUE(w->AddTensor("blk.0.ffn_up.weight", 8, {32, 2}).ok());  // q8_0: 68
    ASSERT_TRUE(w->WriteTensorZeros("token_embd.weight", 204).ok());
    ASSERT_TRUE(w->WriteTensorZeros("output_norm.weight", 256).ok());
    ASSERT_TRUE(w->WriteTensorZeros("blk.0.ffn_up.weight", 68).ok());
    ASSERT_TRUE(w->Finish().ok());
  }
  void TearDown() override { ::unlink(path_.c_str()); }

  // Runs `tandem inspect` with `args`; returns the exit code, filling stdout and stderr.
  int Run(std::vector<std::string> args, std::string* out, std::string* err) {
    args.insert(args.begin(), "inspect");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    const int rc = RunInspectCommand(static_cast<int>(argv.size()), argv.data());
    *out = ::testing::internal::GetCapturedStdout();
    *err = ::testing::internal::GetCapturedStderr();
    return rc;
  }

  std::string path_;
};

TEST_F(InspectCommandTest, PrintsText) {
  std::string out, err;
  ASSERT_EQ(Run({path_}, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("GGUF version 3, alignment 64"));
  EXPECT_THAT(out, HasSubstr("metadata (7 keys):"));  // general.alignment added by the writer
  EXPECT_THAT(out, ::testing::ContainsRegex("general.architecture +string \"qwen3next\"\n"));
  EXPECT_THAT(out, HasSubstr("qwen3next.block_count"));
  EXPECT_THAT(out, HasSubstr("u32    48\n"));
  EXPECT_THAT(out, HasSubstr("f32    1e+07\n"));
  EXPECT_THAT(out, HasSubstr(
                       "array  array<string>[10] [\"a\", \"\\\"q\\\"\", \"\\n\", \"\xff\", \"e\", \"f\", \"g\", \"h\", ...]"));
  EXPECT_THAT(out, HasSubstr("array<array>[1] [array<i32>[2] [1, -2]]"));
  EXPECT_THAT(out, HasSubstr("tensors (3):"));
  EXPECT_THAT(out, ::testing::ContainsRegex("token_embd.weight +q8_0 +\\[64, 3\\] +204 +0\n"));
  EXPECT_THAT(out, ::testing::ContainsRegex("output_norm.weight +f32 +\\[64\\] +256 +256\n"));
  EXPECT_THAT(out, ::testing::ContainsRegex("blk.0.ffn_up.weight +q8_0 +\\[32, 2\\] +68 +512\n"));
  EXPECT_THAT(out, ::testing::ContainsRegex("f32 +1 tensors +256 bytes"));
  EXPECT_THAT(out, ::testing::ContainsRegex("q8_0 +2 tensors +272 bytes"));
  EXPECT_THAT(out, HasSubstr("total: 3 tensors, 528 bytes"));
}

TEST_F(InspectCommandTest, PrintsJson) {
  std::string out, err;
  ASSERT_EQ(Run({path_, "--json"}, &out, &err), 0) << err;
  EXPECT_TRUE(JsonChecker(out).Valid()) << out;
  EXPECT_THAT(out, HasSubstr("\"version\": 3, \"alignment\": 64"));
  EXPECT_THAT(out, HasSubstr("{\"key\": \"qwen3next.block_count\", \"type\": \"u32\", \"value\": 48}"));
  EXPECT_THAT(out, HasSubstr("{\"key\": \"nan\", \"type\": \"f32\", \"value\": null}"));
  EXPECT_THAT(out, HasSubstr("\"element_type\": \"string\", \"length\": 10, \"first\": [\"a\", \"\\\"q\\\"\", "
                             "\"\\n\", \"\\ufffd\", \"e\", \"f\", \"g\", \"h\"]"));
  EXPECT_THAT(out, HasSubstr("\"element_type\": \"array\", \"length\": 1, \"first\": [{\"element_type\": \"i32\", "
                             "\"length\": 2, \"first\": [1, -2]}]"));
  EXPECT_THAT(out, HasSubstr("{\"name\": \"blk.0.ffn_up.weight\", \"type\": \"q8_0\", \"type_id\": 8, \"shape\": "
                             "[32, 2], \"elements\": 64, \"bytes\": 68, \"offset\": 512"));
  EXPECT_THAT(out, HasSubstr("{\"type\": \"f32\", \"count\": 1, \"bytes\": 256}, {\"type\": \"q8_0\", \"count\": 2, "
                             "\"bytes\": 272}"));
  EXPECT_THAT(out, HasSubstr("\"total\": {\"count\": 3, \"bytes\": 528}"));
}

TEST_F(InspectCommandTest, BadFileAndUsage) {
  std::string out, err;
  EXPECT_EQ(Run({path_ + ".missing"}, &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("no such file"));
  EXPECT_TRUE(out.empty());

  // Truncated inside the last tensor's data.
  const uint64_t data_offset = (*GgufFile::Open(path_))->data_offset();
  ASSERT_EQ(::truncate(path_.c_str(), static_cast<off_t>(data_offset + 520)), 0);
  EXPECT_EQ(Run({path_, "--json"}, &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("tensor 'blk.0.ffn_up.weight' (info 2): offset at byte"));
  EXPECT_THAT(err, HasSubstr("runs past the end of the file"));

  EXPECT_EQ(Run({}, &out, &err), 2);
  EXPECT_EQ(Run({path_, "--bogus"}, &out, &err), 2);
}

TEST(JsonQuoteTest, EscapesControlAndInvalidUtf8) {
  EXPECT_EQ(JsonQuote("a\"b\\c\x01\t"), "\"a\\\"b\\\\c\\u0001\\t\"");
  EXPECT_EQ(JsonQuote("\xc3\xa9"), "\"\xc3\xa9\"");         // é stays as is
  EXPECT_EQ(JsonQuote("\xc3"), "\"\\ufffd\"");              // truncated sequence
  EXPECT_EQ(JsonQuote("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // surrogate
  EXPECT_TRUE(JsonChecker(JsonQuote(std::string("\0\x7f\x80", 3))).Valid());
}

}  // namespace
}  // namespace tandem
