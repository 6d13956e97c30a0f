// Unicode code point classes used by the Qwen2 pre-tokenizer, from generated range tables
// (scripts/gen_unicode_tables.py writes unicode_tables.cc; rerun it rather than editing that file).
#ifndef TANDEM_COMMON_TOKENIZER_UNICODE_TABLES_H_
#define TANDEM_COMMON_TOKENIZER_UNICODE_TABLES_H_

namespace tandem {

// The Unicode version the tables were generated from, e.g. "14.0.0".
extern const char kUnicodeTablesVersion[];

// General category L (Lu, Ll, Lt, Lm, Lo): what the regex class \p{L} matches.
bool IsUnicodeLetter(char32_t cp);
// General category N (Nd, Nl, No): what \p{N} matches.
bool IsUnicodeNumber(char32_t cp);
// The White_Space property: what \s matches in Unicode-aware regex engines (Oniguruma, PCRE2 with
// UCP, Python's `regex`). Note U+001C..U+001F and U+200B are not White_Space.
bool IsUnicodeWhiteSpace(char32_t cp);

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_UNICODE_TABLES_H_
