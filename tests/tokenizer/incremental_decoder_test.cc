#include "common/tokenizer/incremental_decoder.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/small_tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

#define REPL "\xEF\xBF\xBD"

// The small tokenizer's ids 0..255 are the single bytes (id = byte value).
const Tokenizer& Small() {
  static const Tokenizer* tok = [] {
    absl::StatusOr<TokenizerSpec> spec = MakeSmallByteLevelTokenizer(512);
    EXPECT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<Tokenizer> created = Tokenizer::Create(*std::move(spec));
    EXPECT_TRUE(created.ok()) << created.status();
    return new Tokenizer(*std::move(created));
  }();
  return *tok;
}

std::string PushOrDie(IncrementalDecoder& decoder, int32_t id) {
  absl::StatusOr<std::string> piece = decoder.Push(id);
  EXPECT_TRUE(piece.ok()) << piece.status();
  return piece.ok() ? *piece : "<error>";
}

TEST(IncrementalDecoderTest, MultiByteCharacterAppearsOnlyWhenComplete) {
  IncrementalDecoder decoder(Small());
  EXPECT_EQ(PushOrDie(decoder, 'A'), "A");
  // U+1F600 is F0 9F 98 80: one single-byte token at a time.
  EXPECT_EQ(PushOrDie(decoder, 0xF0), "");
  EXPECT_EQ(PushOrDie(decoder, 0x9F), "");
  EXPECT_EQ(PushOrDie(decoder, 0x98), "");
  EXPECT_EQ(decoder.pending_bytes(), 3u);
  EXPECT_EQ(PushOrDie(decoder, 0x80), "\xF0\x9F\x98\x80");
  // The euro sign E2 82 AC.
  EXPECT_EQ(PushOrDie(decoder, 0xE2), "");
  EXPECT_EQ(PushOrDie(decoder, 0x82), "");
  EXPECT_EQ(PushOrDie(decoder, 0xAC), "\xE2\x82\xAC");
  EXPECT_EQ(decoder.Finish(), "");
}

TEST(IncrementalDecoderTest, InvalidSequencesBecomeReplacementCharacters) {
  IncrementalDecoder decoder(Small());
  EXPECT_EQ(PushOrDie(decoder, 0xE2), "");
  EXPECT_EQ(PushOrDie(decoder, 0x82), "");
  EXPECT_EQ(PushOrDie(decoder, 'x'), REPL "x");  // broken by 'x': one U+FFFD for E2 82
  EXPECT_EQ(PushOrDie(decoder, 0xFF), REPL);     // never valid: emitted at once
  EXPECT_EQ(PushOrDie(decoder, 0x80), REPL);     // lone continuation byte
  EXPECT_EQ(PushOrDie(decoder, 0xF0), "");
  EXPECT_EQ(PushOrDie(decoder, 0x80), REPL REPL);  // F0 80 is never valid: two subparts
  EXPECT_EQ(PushOrDie(decoder, 0xF0), "");
  EXPECT_EQ(PushOrDie(decoder, 0x9F), "");
  EXPECT_EQ(decoder.Finish(), REPL);  // the truncated tail at the end: one U+FFFD
  EXPECT_EQ(decoder.pending_bytes(), 0u);
  EXPECT_EQ(PushOrDie(decoder, 'y'), "y");
}

TEST(IncrementalDecoderTest, RejectsOutOfRangeIds) {
  IncrementalDecoder decoder(Small());
  EXPECT_EQ(PushOrDie(decoder, 0xE2), "");
  EXPECT_FALSE(decoder.Push(512).ok());
  EXPECT_FALSE(decoder.Push(-3).ok());
  EXPECT_EQ(decoder.pending_bytes(), 1u);  // state unchanged
}

TEST(IncrementalDecoderTest, PiecesConcatenateToDecodeToText) {
  const Tokenizer& tok = Small();
  std::mt19937 rng(1234);  // fixed seed: the same id sequences every run
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> ids;
    const int length = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < length; ++i) {
      // Mostly single bytes around the UTF-8 lead/continuation ranges, some learned and control.
      const uint32_t pick = rng() % 8;
      if (pick < 5) {
        ids.push_back(static_cast<int32_t>(0x80 + rng() % 0x80));
      } else if (pick < 7) {
        ids.push_back(static_cast<int32_t>(rng() % tok.vocab_size()));
      } else {
        ids.push_back(static_cast<int32_t>(rng() % 0x80));
      }
    }
    IncrementalDecoder decoder(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += PushOrDie(decoder, id);
    streamed += decoder.Finish();
    absl::StatusOr<std::string> whole = tok.DecodeToText(ids);
    ASSERT_TRUE(whole.ok()) << whole.status();
    ASSERT_EQ(streamed, *whole) << "trial " << trial;
  }
}

TEST(IncrementalDecoderTest, EncodedTextStreamsBackExactly) {
  const Tokenizer& tok = Small();
  const std::string text =
      "Caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB done.\n";
  IncrementalDecoder decoder(tok);
  std::string streamed;
  for (int32_t id : tok.Encode(text, true)) {
    const std::string piece = PushOrDie(decoder, id);
    EXPECT_EQ(SanitizeUtf8(piece), piece);  // every piece is valid UTF-8 on its own
    streamed += piece;
  }
  streamed += decoder.Finish();
  EXPECT_EQ(streamed, text);
}

}  // namespace
}  // namespace tandem
