// The Qwen2 pre-tokenizer: splits text into the pieces that byte-level BPE then encodes one by one.
//
// It reproduces, match for match, re.findall with the Qwen2 split pattern
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// (leftmost alternative wins, each quantifier greedy with backtracking). It is a hand-written
// scanner over code points because std::regex has no \p{..} classes and no Unicode \s.
// \p{L}, \p{N} and \s come from generated tables (unicode_tables.h); \s is White_Space.
// The case-insensitive contractions use Unicode simple case folding as Oniguruma (Hugging Face
// tokenizers) and Python's `regex` do; for these letters that adds only U+017F LATIN SMALL LETTER
// LONG S as an 's'. (llama.cpp writes the group as '[sS]|'[tT]|... and differs only there.)
// Bytes that are not valid UTF-8 are each treated as one code point of no class (like
// punctuation), so any byte string splits into pieces whose concatenation is the input.
#ifndef TANDEM_COMMON_TOKENIZER_QWEN2_PRETOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_QWEN2_PRETOKENIZER_H_

#include <string_view>
#include <vector>

namespace tandem {

// Returns the pieces in order; they are views into `text`, non-empty, and concatenate to `text`.
std::vector<std::string_view> PreTokenizeQwen2(std::string_view text);

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_QWEN2_PRETOKENIZER_H_
