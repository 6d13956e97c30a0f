#include "common/tokenizer/qwen2_pretokenizer.h"

#include <cstdint>

#include "common/tokenizer/unicode_tables.h"
#include "common/tokenizer/utf8.h"

namespace tandem {
namespace {

// The classes the pattern distinguishes. \s = kLineBreak or kSpace; "other" is [^\s\p{L}\p{N}].
enum class CharClass : uint8_t { kLetter, kNumber, kLineBreak, kSpace, kOther };

struct CodeUnit {
  uint32_t offset;  // byte offset in the text
  char32_t cp;      // kReplacementCharacter for an invalid byte
  CharClass cls;
};

CharClass Classify(char32_t cp) {
  if (cp < 0x80) {  // ASCII fast path
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    if (cp == '\r' || cp == '\n') return CharClass::kLineBreak;
    if (cp == ' ' || (cp >= '\t' && cp <= '\f')) return CharClass::kSpace;
    return CharClass::kOther;
  }
  if (IsUnicodeLetter(cp)) return CharClass::kLetter;
  if (IsUnicodeNumber(cp)) return CharClass::kNumber;
  if (IsUnicodeWhiteSpace(cp)) return CharClass::kSpace;
  return CharClass::kOther;
}

std::vector<CodeUnit> Decode(std::string_view text) {
  std::vector<CodeUnit> units;
  units.reserve(text.size());
  for (size_t offset = 0; offset < text.size();) {
    const Utf8Step step = DecodeUtf8Step(text, offset);
    if (step.valid) {
      units.push_back({static_cast<uint32_t>(offset), step.code_point, Classify(step.code_point)});
      offset += step.length;
    } else {
      units.push_back({static_cast<uint32_t>(offset), kReplacementCharacter, CharClass::kOther});
      offset += 1;
    }
  }
  return units;
}

// Simple Unicode case folding restricted to what can equal s, t, r, e, v, m, l or d: the ASCII
// capitals and U+017F LATIN SMALL LETTER LONG S (which folds to 's').
char32_t FoldCase(char32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + ('a' - 'A');
  if (cp == 0x017F) return 's';
  return cp;
}

bool IsSpace(CharClass cls) { return cls == CharClass::kSpace || cls == CharClass::kLineBreak; }

// Length in code units of the contraction at i, or 0: (?i:'s|'t|'re|'ve|'m|'ll|'d).
size_t MatchContraction(const std::vector<CodeUnit>& u, size_t i) {
  const size_t n = u.size();
  if (u[i].cp != '\'' || i + 1 >= n) return 0;
  const char32_t c1 = FoldCase(u[i + 1].cp);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (i + 2 >= n) return 0;
  const char32_t c2 = FoldCase(u[i + 2].cp);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

size_t RunEnd(const std::vector<CodeUnit>& u, size_t i, CharClass cls) {
  while (i < u.size() && u[i].cls == cls) ++i;
  return i;
}

// End (exclusive, in code units) of the match that starts at i. Every code point starts some
// alternative, so a match always exists and is non-empty.
size_t MatchEnd(const std::vector<CodeUnit>& u, size_t i) {
  const size_t n = u.size();
  const CharClass cls = u[i].cls;

  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (const size_t length = MatchContraction(u, i); length > 0) return i + length;

  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (cls == CharClass::kLetter) return RunEnd(u, i, CharClass::kLetter);
  if ((cls == CharClass::kSpace || cls == CharClass::kOther) && i + 1 < n &&
      u[i + 1].cls == CharClass::kLetter) {
    return RunEnd(u, i + 1, CharClass::kLetter);
  }

  // \p{N}  (one code point: Qwen2 does not group digits)
  if (cls == CharClass::kNumber) return i + 1;

  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'  (the optional character is U+0020 only)
  size_t other_start = n;
  if (cls == CharClass::kOther) {
    other_start = i;
  } else if (u[i].cp == ' ' && i + 1 < n && u[i + 1].cls == CharClass::kOther) {
    other_start = i + 1;
  }
  if (other_start < n) {
    const size_t other_end = RunEnd(u, other_start, CharClass::kOther);
    return RunEnd(u, other_end, CharClass::kLineBreak);
  }

  // Only white space is left at i. Let [i, space_end) be the maximal run of it.
  size_t space_end = i;
  size_t last_line_break = n;  // n: none in the run
  while (space_end < n && IsSpace(u[space_end].cls)) {
    if (u[space_end].cls == CharClass::kLineBreak) last_line_break = space_end;
    ++space_end;
  }
  // \s*[\r\n]+ : \s* backtracks to just before the run's last line break, which [\r\n]+ takes.
  if (last_line_break < n) return last_line_break + 1;
  // \s+(?!\S) : the whole run if it ends the text, else all but its last code point (which then
  // precedes the non-space), provided that leaves at least one.
  if (space_end == n) return n;
  if (space_end - i >= 2) return space_end - 1;
  // \s+
  return space_end;
}

}  // namespace

std::vector<std::string_view> PreTokenizeQwen2(std::string_view text) {
  const std::vector<CodeUnit> units = Decode(text);
  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < units.size();) {
    const size_t end = MatchEnd(units, i);
    const size_t begin_byte = units[i].offset;
    const size_t end_byte = end < units.size() ? units[end].offset : text.size();
    pieces.push_back(text.substr(begin_byte, end_byte - begin_byte));
    i = end;
  }
  return pieces;
}

}  // namespace tandem
