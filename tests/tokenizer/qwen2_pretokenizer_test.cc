// Golden splits of the Qwen2 pattern, written by hand from the regex's semantics (leftmost
// alternative, greedy with backtracking). Each was also checked once against Python's `regex`
// module (see the tokenizer report); this test does not need Python.
#include "common/tokenizer/qwen2_pretokenizer.h"

#include <string>
#include <vector>

#include "common/tokenizer/unicode_tables.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

std::vector<std::string> Split(const std::string& text) {
  std::vector<std::string> out;
  for (std::string_view piece : PreTokenizeQwen2(text)) out.emplace_back(piece);
  return out;
}

using Pieces = std::vector<std::string>;

TEST(UnicodeTablesTest, ClassesAtRangeEdges) {
  EXPECT_TRUE(IsUnicodeLetter(U'A') && IsUnicodeLetter(U'z') && !IsUnicodeLetter(U'@'));
  EXPECT_TRUE(IsUnicodeLetter(0x4E00) && IsUnicodeLetter(0x00AA));  // Lo (CJK, ordinal)
  EXPECT_TRUE(IsUnicodeLetter(0x02B0));                              // Lm
  EXPECT_FALSE(IsUnicodeLetter(0x0301));                             // Mn combining mark
  EXPECT_FALSE(IsUnicodeLetter(0x10FFFF));
  EXPECT_TRUE(IsUnicodeNumber(U'0') && IsUnicodeNumber(0x0663) && IsUnicodeNumber(0x2160));
  EXPECT_FALSE(IsUnicodeNumber(U'x'));
  EXPECT_TRUE(IsUnicodeWhiteSpace(0x0085) && IsUnicodeWhiteSpace(0x3000));
  EXPECT_FALSE(IsUnicodeWhiteSpace(0x001C) || IsUnicodeWhiteSpace(0x200B));  // not White_Space
  EXPECT_FALSE(std::string(kUnicodeTablesVersion).empty());
}

TEST(Qwen2PreTokenizerTest, NumbersAreSingleCodePoints) {
  EXPECT_EQ(Split("12345"), (Pieces{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(Split("abc123"), (Pieces{"abc", "1", "2", "3"}));
  EXPECT_EQ(Split("3.14"), (Pieces{"3", ".", "1", "4"}));
  EXPECT_EQ(Split("x 42"), (Pieces{"x", " ", "4", "2"}));  // a space never joins a digit
  // U+2160 ROMAN NUMERAL ONE (Nl) and U+00BD VULGAR FRACTION ONE HALF (No) are numbers.
  EXPECT_EQ(Split("\xE2\x85\xA0\xC2\xBD"), (Pieces{"\xE2\x85\xA0", "\xC2\xBD"}));
}

TEST(Qwen2PreTokenizerTest, ContractionsAreCaseInsensitive) {
  EXPECT_EQ(Split("I'm"), (Pieces{"I", "'m"}));
  EXPECT_EQ(Split("DON'T"), (Pieces{"DON", "'T"}));
  EXPECT_EQ(Split("we'll they'RE you've he'd it's"),
            (Pieces{"we", "'ll", " they", "'RE", " you", "'ve", " he", "'d", " it", "'s"}));
  // 's is tried before the letter alternative, so "'sup" splits after the s.
  EXPECT_EQ(Split("'sup"), (Pieces{"'s", "up"}));
  // Not a contraction: the apostrophe joins the letters as their optional leading character.
  EXPECT_EQ(Split("'hello"), (Pieces{"'hello"}));
  EXPECT_EQ(Split("rock'n'roll"), (Pieces{"rock", "'n", "'roll"}));
  // Case folding: U+017F (long s) folds to 's', so it ends a contraction; Kelvin sign K does not
  // fold to any of the letters.
  EXPECT_EQ(Split("'\xC5\xBFx"), (Pieces{"'\xC5\xBF", "x"}));
  EXPECT_EQ(Split("'\xE2\x84\xAAx"), (Pieces{"'\xE2\x84\xAAx"}));
}

TEST(Qwen2PreTokenizerTest, SpacesBeforeLettersJoinThem) {
  EXPECT_EQ(Split("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(Split(" leading"), (Pieces{" leading"}));
  EXPECT_EQ(Split("a\tb"), (Pieces{"a", "\tb"}));  // any non-newline space or symbol can lead
  EXPECT_EQ(Split("a\nb"), (Pieces{"a", "\n", "b"}));  // but not \r or \n
  EXPECT_EQ(Split("$dollar"), (Pieces{"$dollar"}));
}

TEST(Qwen2PreTokenizerTest, RunsOfSpacesAndNewlines) {
  EXPECT_EQ(Split("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(Split("a   \n\n  b"), (Pieces{"a", "   \n\n", " ", " b"}));
  EXPECT_EQ(Split("trailing   "), (Pieces{"trailing", "   "}));
  EXPECT_EQ(Split("a\r\nb"), (Pieces{"a", "\r\n", "b"}));
  EXPECT_EQ(Split("\r\n"), (Pieces{"\r\n"}));
  EXPECT_EQ(Split("x \r\n y"), (Pieces{"x", " \r\n", " y"}));
  EXPECT_EQ(Split("a\n  \n b"), (Pieces{"a", "\n  \n", " b"}));
  EXPECT_EQ(Split("a \n  "), (Pieces{"a", " \n", "  "}));  // spaces after the last newline
  EXPECT_EQ(Split("   "), (Pieces{"   "}));
  EXPECT_EQ(Split("  1"), (Pieces{" ", " ", "1"}));
  EXPECT_EQ(Split("a \t b"), (Pieces{"a", " \t", " b"}));
}

TEST(Qwen2PreTokenizerTest, PunctuationRunsTakeTrailingNewlines) {
  EXPECT_EQ(Split("Hi!!!\n\nBye"), (Pieces{"Hi", "!!!\n\n", "Bye"}));
  EXPECT_EQ(Split("x ...\r\n"), (Pieces{"x", " ...\r\n"}));
  EXPECT_EQ(Split("  !!\n\nx"), (Pieces{" ", " !!\n\n", "x"}));
  EXPECT_EQ(Split("f(x);\n}"), (Pieces{"f", "(x", ");\n", "}"}));
  EXPECT_EQ(Split("a.b"), (Pieces{"a", ".b"}));
  EXPECT_EQ(Split("if (a == b) {"), (Pieces{"if", " (", "a", " ==", " b", ")", " {"}));
  EXPECT_EQ(Split("\t!?"), (Pieces{"\t", "!?"}));  // only U+0020 may lead a symbol run
}

TEST(Qwen2PreTokenizerTest, NonAscii) {
  // CJK ideographs are letters; the full-width comma is punctuation.
  EXPECT_EQ(Split("\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C"),
            (Pieces{"\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C"}));
  // A combining mark (Mn) is not a letter: "e" + U+0301 splits after the e.
  EXPECT_EQ(Split("e\xCC\x81t\xC3\xA9"), (Pieces{"e", "\xCC\x81t\xC3\xA9"}));
  // Emoji with ZWJ are symbols (So, Cf): one run.
  EXPECT_EQ(Split(" \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB!"),
            (Pieces{" \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB!"}));
  // U+3000 IDEOGRAPHIC SPACE is white space; U+00A0 too.
  const std::string ideographic_space = "\xE3\x80\x80";
  EXPECT_EQ(Split("a" + ideographic_space + ideographic_space + "b"),
            (Pieces{"a", ideographic_space, ideographic_space + "b"}));
  EXPECT_EQ(Split("a\xC2\xA0"), (Pieces{"a", "\xC2\xA0"}));
}

TEST(Qwen2PreTokenizerTest, InvalidBytesActLikeSymbolsAndAreKept) {
  EXPECT_EQ(Split("ab\xFF\xFE" "cd"), (Pieces{"ab", "\xFF\xFE", "cd"}));  // like "ab!!cd"
  EXPECT_EQ(Split("ab\xFF" "cd"), (Pieces{"ab", "\xFF" "cd"}));             // like "ab!cd"
  EXPECT_EQ(Split(" \x80\n"), (Pieces{" \x80\n"}));
  EXPECT_EQ(Split(""), Pieces{});
}

TEST(Qwen2PreTokenizerTest, PiecesConcatenateToTheInput) {
  const std::string text =
      "Mixed: I'm here.\r\n\tdef f(x):\n        return x**2  # 12 \xF0\x9F\x98\x80 \xE2\x80\x94 "
      "caf\xC3\xA9   \n\n\n  end \xC3";
  std::string joined;
  for (std::string_view piece : PreTokenizeQwen2(text)) {
    EXPECT_FALSE(piece.empty());
    joined += piece;
  }
  EXPECT_EQ(joined, text);
}

}  // namespace
}  // namespace tandem
