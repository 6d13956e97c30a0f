#include "common/tokenizer/utf8.h"

#include <string>
#include <vector>

#include "common/tokenizer/byte_level.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

#define REPL "\xEF\xBF\xBD"  // U+FFFD in UTF-8

struct SanitizeCase {
  std::string input;
  std::string expected;
};

// Expected outputs equal Python's bytes.decode("utf-8", "replace"), which applies the same
// maximal-subpart rule; the last case is the Unicode Standard's own example (Table 3-8).
const std::vector<SanitizeCase>& SanitizeCases() {
  static const std::vector<SanitizeCase> cases = {
      {"plain ascii", "plain ascii"},
      {"\xE2\x82\xAC", "\xE2\x82\xAC"},              // the euro sign is valid
      {"\xE2\x82" "A", REPL "A"},                    // truncated 3-byte sequence, then ASCII
      {"\xF0\x80", REPL REPL},                       // 0x80 cannot follow 0xF0 (overlong)
      {"\xC0\xAF", REPL REPL},                       // C0 never starts a sequence
      {"\xED\xA0\x80", REPL REPL REPL},              // a surrogate: A0 cannot follow ED
      {"\xF4\x90\x80\x80", REPL REPL REPL REPL},     // above U+10FFFF
      {"\xE0\x80\xAF", REPL REPL REPL},              // overlong 3-byte
      {"\xFF\xFE", REPL REPL},
      {"a\x80" "b", "a" REPL "b"},                   // lone continuation byte
      {"\xF0\x9F\x98", REPL},                        // truncated at the end: one U+FFFD
      {"\xF0\x9F\x98\x80\xF0\x9F", "\xF0\x9F\x98\x80" REPL},
      {"a\xF1\x80\x80\xE1\x80\xC2" "b\x80" "c\x80\xBF" "d",
       "a" REPL REPL REPL "b" REPL "c" REPL REPL "d"},
      {std::string("\0x", 2), std::string("\0x", 2)},  // NUL is valid UTF-8
  };
  return cases;
}

TEST(SanitizeUtf8Test, ReplacesEachMaximalSubpartOnce) {
  for (const SanitizeCase& c : SanitizeCases()) {
    EXPECT_EQ(SanitizeUtf8(c.input), c.expected) << "input: " << ByteLevelEncode(c.input);
  }
}

TEST(Utf8StreamSanitizerTest, EverySplitGivesTheWholeResult) {
  for (const SanitizeCase& c : SanitizeCases()) {
    // Feed the input in every two-piece split and also byte by byte.
    for (size_t cut = 0; cut <= c.input.size(); ++cut) {
      Utf8StreamSanitizer stream;
      std::string out = stream.Push(c.input.substr(0, cut));
      out += stream.Push(c.input.substr(cut));
      out += stream.Finish();
      EXPECT_EQ(out, c.expected) << "cut " << cut << " of " << ByteLevelEncode(c.input);
    }
    Utf8StreamSanitizer stream;
    std::string out;
    for (char byte : c.input) out += stream.Push(std::string(1, byte));
    out += stream.Finish();
    EXPECT_EQ(out, c.expected) << "byte by byte: " << ByteLevelEncode(c.input);
  }
}

TEST(Utf8StreamSanitizerTest, HoldsAnIncompleteCharacterUntilComplete) {
  Utf8StreamSanitizer stream;
  EXPECT_EQ(stream.Push("x\xF0"), "x");
  EXPECT_EQ(stream.pending_bytes(), 1u);
  EXPECT_EQ(stream.Push("\x9F"), "");
  EXPECT_EQ(stream.Push("\x98"), "");
  EXPECT_EQ(stream.pending_bytes(), 3u);
  EXPECT_EQ(stream.Push("\x80"), "\xF0\x9F\x98\x80");  // U+1F600
  EXPECT_EQ(stream.pending_bytes(), 0u);
  EXPECT_EQ(stream.Push("\xE2"), "");
  EXPECT_EQ(stream.Finish(), REPL);  // flushed as one replacement, state reset
  EXPECT_EQ(stream.Push("ok"), "ok");
}

TEST(Utf8Test, DecodeStepReportsLengthAndTruncation) {
  Utf8Step step = DecodeUtf8Step("\xE2\x82\xAC", 0);
  EXPECT_TRUE(step.valid);
  EXPECT_EQ(step.code_point, 0x20ACu);
  EXPECT_EQ(step.length, 3);
  step = DecodeUtf8Step("\xE2\x82", 0);
  EXPECT_FALSE(step.valid);
  EXPECT_TRUE(step.truncated);
  EXPECT_EQ(step.length, 2);
  step = DecodeUtf8Step("\xE2\x82!", 0);
  EXPECT_FALSE(step.valid);
  EXPECT_FALSE(step.truncated);
  EXPECT_EQ(step.length, 2);
}

TEST(Utf8Test, AppendUtf8EncodesEveryLength) {
  std::string out;
  for (char32_t cp : {U'A', U'\u00E9', U'\u4F60', U'\U0001F600'}) AppendUtf8(cp, &out);
  EXPECT_EQ(out, "A\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80");
}

TEST(ByteLevelTest, MapsBytesAsGpt2) {
  EXPECT_EQ(ByteLevelEncode(" "), "\xC4\xA0");    // 'Ġ' U+0120
  EXPECT_EQ(ByteLevelEncode("\n"), "\xC4\x8A");   // 'Ċ' U+010A
  EXPECT_EQ(ByteLevelEncode("\t"), "\xC4\x89");   // 'ĉ' U+0109
  EXPECT_EQ(ByteLevelEncode("a!~"), "a!~");       // printable ASCII maps to itself
  EXPECT_EQ(ByteLevelEncode("\xAD"), "\xC5\x83");  // soft hyphen -> 'Ń' U+0143, the last shifted
  EXPECT_EQ(ByteLevelEncode("\xE9"), "\xC3\xA9");  // Latin-1 printable maps to itself
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  absl::StatusOr<std::string> back = ByteLevelDecode(ByteLevelEncode(all));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, all);
}

TEST(ByteLevelTest, DecodeRejectsUnmappedCodePoints) {
  absl::StatusOr<std::string> result = ByteLevelDecode("ab c");  // a raw space is not mapped
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("U+0020 at byte offset 2"), std::string::npos)
      << result.status();
  EXPECT_FALSE(ByteLevelDecode("\xFF").ok());
}

}  // namespace
}  // namespace tandem
