#include "common/tokenizer/tokenizer.h"

#include <functional>
#include <string>
#include <vector>

#include "common/tokenizer/byte_level.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A hand-built vocabulary: ids 0..255 are the bytes (id = byte value), then:
constexpr int32_t kBC = 256, kAB = 257, kABC = 258, kAA = 259, kAAAA = 260;
constexpr int32_t kImStart = 261, kImEnd = 262, kTool = 263, kToolBang = 264, kPad = 265;

TokenizerSpec TinySpec() {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "qwen2";
  for (int b = 0; b < 256; ++b) {
    spec.tokens.push_back(ByteLevelEncode(std::string(1, static_cast<char>(b))));
    spec.token_types.push_back(1);
  }
  for (const char* text : {"bc", "ab", "abc", "aa", "aaaa"}) {
    spec.tokens.push_back(text);
    spec.token_types.push_back(1);
  }
  spec.tokens.push_back("<|im_start|>");
  spec.token_types.push_back(3);
  spec.tokens.push_back("<|im_end|>");
  spec.token_types.push_back(3);
  spec.tokens.push_back("<tool>");
  spec.token_types.push_back(4);
  spec.tokens.push_back("<tool>!");
  spec.token_types.push_back(4);
  spec.tokens.push_back("[PAD265]");
  spec.token_types.push_back(5);
  // Rank order deliberately differs from left-to-right order.
  spec.merges = {"b c", "a b", "a bc", "a a", "aa aa"};
  spec.bos_id = kImStart;
  spec.eos_id = kImEnd;
  return spec;
}

Tokenizer TinyTokenizer() {
  absl::StatusOr<Tokenizer> tok = Tokenizer::Create(TinySpec());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

std::string DecodeOrDie(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  absl::StatusOr<std::string> text = tok.Decode(ids);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

TEST(TokenizerTest, LowestRankMergesFirst) {
  const Tokenizer tok = TinyTokenizer();
  // "b c" (rank 0) beats "a b" (rank 1), and then "a bc" applies: not ab + c.
  EXPECT_THAT(tok.Encode("abc", false), ElementsAre(kABC));
  EXPECT_THAT(tok.Encode("ab", false), ElementsAre(kAB));
  EXPECT_THAT(tok.Encode("abd", false), ElementsAre(kAB, 'd'));
  EXPECT_THAT(tok.Encode("xbcab", false), ElementsAre('x', kBC, kAB));
  EXPECT_THAT(tok.Encode("cab", false), ElementsAre('c', kAB));
}

TEST(TokenizerTest, EqualRanksMergeLeftmostFirst) {
  const Tokenizer tok = TinyTokenizer();
  EXPECT_THAT(tok.Encode("aaa", false), ElementsAre(kAA, 'a'));
  EXPECT_THAT(tok.Encode("aaaa", false), ElementsAre(kAAAA));
  EXPECT_THAT(tok.Encode("aaaaa", false), ElementsAre(kAAAA, 'a'));
  EXPECT_THAT(tok.Encode("aaaaaa", false), ElementsAre(kAAAA, kAA));
}

TEST(TokenizerTest, MergesStayInsidePreTokenizedPieces) {
  const Tokenizer tok = TinyTokenizer();
  // "abc abc" splits into "abc" and " abc"; there is no merge with the space.
  EXPECT_THAT(tok.Encode("abc abc", false), ElementsAre(kABC, ' ', kABC));
  // "a" and "a" are separate pieces across a newline.
  EXPECT_THAT(tok.Encode("a\na", false), ElementsAre('a', '\n', 'a'));
  EXPECT_THAT(tok.Encode("12", false), ElementsAre('1', '2'));
  EXPECT_TRUE(tok.Encode("", true).empty());
}

TEST(TokenizerTest, ControlTokensMatchOnlyWhenParsingSpecial) {
  const Tokenizer tok = TinyTokenizer();
  EXPECT_THAT(tok.Encode("<|im_start|>abc<|im_end|>", true), ElementsAre(kImStart, kABC, kImEnd));
  const std::string marker = "<|im_end|>";
  std::vector<int32_t> bytes(marker.begin(), marker.end());  // no merges apply to these bytes
  EXPECT_EQ(tok.Encode(marker, false), bytes);
  EXPECT_EQ(DecodeOrDie(tok, tok.Encode("x<|im_start|>y", false)), "x<|im_start|>y");
}

TEST(TokenizerTest, UserDefinedTokensAlwaysMatchLongestFirst) {
  const Tokenizer tok = TinyTokenizer();
  EXPECT_THAT(tok.Encode("ab<tool>ab", false), ElementsAre(kAB, kTool, kAB));
  EXPECT_THAT(tok.Encode("<tool>!", false), ElementsAre(kToolBang));
  EXPECT_THAT(tok.Encode("<tool>?", true), ElementsAre(kTool, '?'));
  // An unused token is never produced.
  EXPECT_EQ(DecodeOrDie(tok, tok.Encode("[PAD265]", true)), "[PAD265]");
  for (int32_t id : tok.Encode("[PAD265]", true)) EXPECT_NE(id, kPad);
}

TEST(TokenizerTest, DecodeGivesExactBytes) {
  const Tokenizer tok = TinyTokenizer();
  EXPECT_EQ(DecodeOrDie(tok, {kImStart, kABC, ' ', kAAAA, 0xFF, kImEnd}),
            "<|im_start|>abc aaaa\xFF<|im_end|>");
  EXPECT_EQ(tok.TokenBytes(' '), " ");
  EXPECT_EQ(tok.TokenBytes(kTool), "<tool>");
  absl::StatusOr<std::string> text = tok.DecodeToText(std::vector<int32_t>{'a', 0xFF, 'b'});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "a\xEF\xBF\xBD"
            "b");
}

TEST(TokenizerTest, DecodeRejectsOutOfRangeIds) {
  const Tokenizer tok = TinyTokenizer();
  absl::StatusOr<std::string> text = tok.Decode(std::vector<int32_t>{1, 2, 266});
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(std::string(text.status().message()), HasSubstr("token id 266 at index 2"));
  EXPECT_FALSE(tok.Decode(std::vector<int32_t>{-1}).ok());
}

TEST(TokenizerTest, AccessorsReportTheSpec) {
  const Tokenizer tok = TinyTokenizer();
  EXPECT_EQ(tok.vocab_size(), 266);
  EXPECT_EQ(tok.bos_id(), kImStart);
  EXPECT_EQ(tok.eos_id(), kImEnd);
  EXPECT_EQ(tok.pad_id(), std::nullopt);
  EXPECT_TRUE(tok.IsControl(kImEnd));
  EXPECT_FALSE(tok.IsControl(kTool));
  EXPECT_EQ(tok.token_type(kPad), TokenType::kUnused);
  EXPECT_EQ(tok.FindToken("abc"), kABC);
  EXPECT_EQ(tok.FindToken("\xC4\xA0"), ' ');  // mapped form of the space byte
  EXPECT_EQ(tok.FindToken("<|im_end|>"), kImEnd);
  EXPECT_EQ(tok.FindToken("zzz"), std::nullopt);
}

struct BadSpecCase {
  const char* name;
  std::function<void(TokenizerSpec&)> mutate;
  const char* expected_message_part;
};

TEST(TokenizerTest, CreateRejectsBadSpecs) {
  const std::vector<BadSpecCase> cases = {
      {"model", [](TokenizerSpec& s) { s.model = "llama"; }, "tokenizer.ggml.model = \"llama\""},
      {"pre", [](TokenizerSpec& s) { s.pre = "llama-bpe"; }, "tokenizer.ggml.pre = \"llama-bpe\""},
      {"no tokens",
       [](TokenizerSpec& s) {
         s.tokens.clear();
         s.token_types.clear();
       },
       "tokenizer.ggml.tokens has 0 entries"},
      {"types length", [](TokenizerSpec& s) { s.token_types.pop_back(); },
       "token_type has 265 entries"},
      {"type value", [](TokenizerSpec& s) { s.token_types[7] = 9; }, "token_type[7] = 9"},
      {"empty token", [](TokenizerSpec& s) { s.tokens[kTool] = ""; }, "tokens[263] is empty"},
      {"raw space", [](TokenizerSpec& s) { s.tokens[kAB] = "a b"; },
       "tokens[257] (a normal token): code point U+0020 at byte offset 1"},
      {"duplicate", [](TokenizerSpec& s) { s.tokens[kAA] = "ab"; },
       "tokens[259] repeats the text of tokens[257]"},
      {"duplicate added", [](TokenizerSpec& s) { s.tokens[kToolBang] = "<tool>"; },
       "tokens[264] repeats the text of added token tokens[263]"},
      {"missing byte", [](TokenizerSpec& s) { s.tokens['q'] = "qq"; },
       "no normal token for byte 0x71"},
      {"byte as control", [](TokenizerSpec& s) { s.token_types['q'] = 3; },
       "no normal token for byte 0x71"},
      {"merge form", [](TokenizerSpec& s) { s.merges[1] = "ab"; }, "merges[1] = \"ab\" is not"},
      {"merge spaces", [](TokenizerSpec& s) { s.merges[1] = "a  b"; }, "merges[1]"},
      {"merge left", [](TokenizerSpec& s) { s.merges[2] = "zz b"; },
       "merges[2] = \"zz b\": left part \"zz\" is not a normal token"},
      {"merge right", [](TokenizerSpec& s) { s.merges[2] = "a <tool>"; }, "right part \"<tool>\""},
      {"merge result", [](TokenizerSpec& s) { s.merges.push_back("c a"); },
       "merges[5] = \"c a\": merged result \"ca\""},
      {"bos", [](TokenizerSpec& s) { s.bos_id = 266; }, "bos_token_id = 266"},
      {"eos", [](TokenizerSpec& s) { s.eos_id = -1; }, "eos_token_id = -1"},
      {"pad", [](TokenizerSpec& s) { s.pad_id = 1000; }, "padding_token_id = 1000"},
  };
  for (const BadSpecCase& c : cases) {
    TokenizerSpec spec = TinySpec();
    c.mutate(spec);
    absl::StatusOr<Tokenizer> tok = Tokenizer::Create(std::move(spec));
    ASSERT_FALSE(tok.ok()) << c.name;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr(c.expected_message_part)) << c.name;
  }
}

TEST(TokenizerTest, CreateAcceptsVariants) {
  TokenizerSpec spec = TinySpec();
  spec.pre = "deepseek-r1-qwen";
  spec.token_types['q'] = 6;     // a byte-type token works like a normal one
  spec.merges.push_back("b c");  // a repeated pair keeps its first rank
  absl::StatusOr<Tokenizer> tok = Tokenizer::Create(std::move(spec));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(tok->Encode("qabc", false), ElementsAre('q', kABC));

  spec = TinySpec();
  spec.token_types.clear();  // all normal: the literal markers become BPE tokens too
  tok = Tokenizer::Create(std::move(spec));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->token_type(kImStart), TokenType::kNormal);
  EXPECT_EQ(tok->Encode("<|im_start|>", true).size(), 12u);  // not matched as a special token
}

}  // namespace
}  // namespace tandem
