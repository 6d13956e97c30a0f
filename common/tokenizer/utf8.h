// UTF-8 decoding with a fixed replacement rule, for turning token bytes into displayable text.
//
// Replacement rule ("U+FFFD substitution of maximal subparts", Unicode Standard ch. 3.9; the same
// as the WHATWG Encoding standard and Python's bytes.decode("utf-8", "replace")): the input is cut
// into well-formed sequences (Unicode Table 3-7: no overlongs, no surrogates, nothing above
// U+10FFFF) and maximal subparts; a maximal subpart is the longest prefix of a well-formed sequence
// that starts at the current byte, or one byte if no well-formed sequence starts with it. Each
// maximal subpart becomes one U+FFFD. Examples: "\xE2\x82" + "A" -> U+FFFD "A";
// "\xF0\x80" -> U+FFFD U+FFFD (0x80 cannot follow 0xF0); "\xC0\xAF" -> U+FFFD U+FFFD.
#ifndef TANDEM_COMMON_TOKENIZER_UTF8_H_
#define TANDEM_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem {

inline constexpr char32_t kReplacementCharacter = 0xFFFD;

struct Utf8Step {
  char32_t code_point;  // the decoded code point; kReplacementCharacter when !valid
  int length;           // bytes consumed: the well-formed sequence or the maximal subpart (>= 1)
  bool valid;           // a well-formed sequence was decoded
  bool truncated;       // !valid only because the input ended inside a well-formed prefix
};

// Decodes the sequence starting at bytes[offset]. Precondition: offset < bytes.size().
Utf8Step DecodeUtf8Step(std::string_view bytes, size_t offset);

// Appends the UTF-8 encoding of `cp` (a Unicode scalar value, not a surrogate) to *out.
void AppendUtf8(char32_t cp, std::string* out);

// Returns `bytes` with every maximal invalid subpart replaced by U+FFFD (rule above). Valid input
// is returned unchanged.
std::string SanitizeUtf8(std::string_view bytes);

// The same rule applied to a byte stream that arrives in pieces. Push() returns the text that is
// decided so far; bytes that form an incomplete but still possibly valid sequence at the end are
// held back until later bytes complete (or break) them. Finish() flushes what is held (an
// incomplete tail becomes one U+FFFD) and resets the state. For any split of a byte string,
// the concatenation of all Push() results and Finish() equals SanitizeUtf8 of the whole.
class Utf8StreamSanitizer {
 public:
  std::string Push(std::string_view bytes);
  std::string Finish();
  // Bytes held back (at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string pending_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_UTF8_H_
