#include "common/tokenizer/small_tokenizer.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/chatml.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TokenizerSpec SpecOrDie(int vocab_size) {
  absl::StatusOr<TokenizerSpec> spec = MakeSmallByteLevelTokenizer(vocab_size);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *std::move(spec) : TokenizerSpec{};
}

TEST(SmallTokenizerTest, IsDeterministic) {
  const TokenizerSpec a = SpecOrDie(700);
  const TokenizerSpec b = SpecOrDie(700);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.token_types, b.token_types);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_id, b.eos_id);
}

TEST(SmallTokenizerTest, FirstMergesMatchAnIndependentTraining) {
  // Pinned: the first merges as also produced by a separate Python BPE trainer (Python's `regex`
  // with the Qwen2 pattern, same tie rule) on the same corpus. A change here changes every
  // generated model's token ids.
  const TokenizerSpec spec = SpecOrDie(kSmallTokenizerMinVocab);
  ASSERT_GE(spec.merges.size(), 6u);
  EXPECT_EQ(std::vector<std::string>(spec.merges.begin(), spec.merges.begin() + 6),
            (std::vector<std::string>{"\xC4\xA0 t", "h e", "\xC4\xA0t he", "\xC4\xA0 \xC4\xA0",
                                      "\xC4\xA0 a", "e r"}));
}

TEST(SmallTokenizerTest, LayoutAndSpecialIds) {
  for (int vocab_size : {kSmallTokenizerMinVocab, 512, 1000, 5000}) {
    SCOPED_TRACE(vocab_size);
    const TokenizerSpec spec = SpecOrDie(vocab_size);
    ASSERT_EQ(spec.tokens.size(), static_cast<size_t>(vocab_size));
    ASSERT_EQ(spec.token_types.size(), spec.tokens.size());
    EXPECT_EQ(spec.model, "gpt2");
    EXPECT_EQ(spec.pre, "qwen2");
    EXPECT_EQ(spec.chat_template, kChatMLTemplate);
    for (int b = 0; b < 256; ++b) {
      EXPECT_EQ(spec.tokens[b], ByteLevelEncode(std::string(1, static_cast<char>(b))));
    }
    const int32_t endoftext = static_cast<int32_t>(256 + spec.merges.size());
    if (vocab_size == 5000) {
      EXPECT_LT(endoftext + 3, vocab_size);  // the corpus runs out of pairs; padding follows
      EXPECT_EQ(spec.tokens.back(), "[PAD4999]");
      EXPECT_EQ(spec.token_types.back(), 5);
    } else {
      EXPECT_EQ(endoftext + 3, vocab_size);  // no padding needed
    }
    EXPECT_EQ(spec.tokens[endoftext], "<|endoftext|>");
    EXPECT_EQ(spec.tokens[endoftext + 1], "<|im_start|>");
    EXPECT_EQ(spec.tokens[endoftext + 2], "<|im_end|>");
    EXPECT_EQ(spec.token_types[endoftext + 1], 3);
    EXPECT_EQ(spec.bos_id, endoftext);
    EXPECT_EQ(spec.pad_id, endoftext);
    EXPECT_EQ(spec.eos_id, endoftext + 2);
    absl::StatusOr<Tokenizer> tok = Tokenizer::Create(spec);
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_EQ(tok->vocab_size(), vocab_size);
  }
}

TEST(SmallTokenizerTest, SmallerVocabulariesArePrefixes) {
  const TokenizerSpec small = SpecOrDie(400);
  const TokenizerSpec large = SpecOrDie(800);
  ASSERT_LT(small.merges.size(), large.merges.size());
  EXPECT_TRUE(std::equal(small.merges.begin(), small.merges.end(), large.merges.begin()));
}

TEST(SmallTokenizerTest, RejectsSizesOutOfRange) {
  EXPECT_FALSE(MakeSmallByteLevelTokenizer(kSmallTokenizerMinVocab - 1).ok());
  EXPECT_FALSE(MakeSmallByteLevelTokenizer(0).ok());
  EXPECT_FALSE(MakeSmallByteLevelTokenizer(kSmallTokenizerMaxVocab + 1).ok());
}

TEST(SmallTokenizerTest, CompressesItsCorpusAndRoundTripsIt) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::Create(SpecOrDie(1000));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string corpus = kSmallTokenizerCorpus;
  const std::vector<int32_t> ids = tok->Encode(corpus, false);
  EXPECT_LT(ids.size() * 2, corpus.size());  // learned merges at work: under half a token a byte
  absl::StatusOr<std::string> back = tok->Decode(ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, corpus);
}

TEST(SmallTokenizerTest, Utf8RoundTrips) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::Create(SpecOrDie(512));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<std::string> texts = {
      "Hello, world! The quick brown fox.",
      "  leading and trailing   \n\n\t\r\n",
      "I'm sure they'LL agree; DON'T panic.",
      "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7\xE2\x80\x8D"
      "\xF0\x9F\x91\xA6 family (ZWJ), \xF0\x9F\x87\xAF\xF0\x9F\x87\xB5 flag, "
      "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD skin tone",
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82 "
      "\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF "
      "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",
      "e\xCC\x81 a\xCC\x8A o\xCC\x88\xCC\x81 Zu\xCC\x88rich \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8"
      "\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 12345 \xD9\xA1\xD9\xA2\xD9\xA3",
      std::string("nul \0 inside", 12),
      "invalid \xFF\xFE \xE2\x82 \xC0\xAF end\xF0",
      "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
  };
  for (const std::string& text : texts) {
    for (bool parse_special : {false, true}) {
      const std::vector<int32_t> ids = tok->Encode(text, parse_special);
      absl::StatusOr<std::string> back = tok->Decode(ids);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, text) << "parse_special=" << parse_special;
    }
  }
}

}  // namespace
}  // namespace tandem
