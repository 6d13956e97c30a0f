// The GPT-2 byte-level alphabet: how byte-level BPE vocabularies (GPT-2, Qwen2, Llama 3) spell
// arbitrary bytes as printable text. Each of the 256 byte values maps to one code point:
// the printable Latin-1 bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF map to themselves, and the other
// 68 bytes, in increasing order, map to U+0100, U+0101, ... (so ' ' is "Ġ" U+0120 and '\n' is
// "Ċ" U+010A). Tokens and merges of such a vocabulary are stored in this mapped form.
#ifndef TANDEM_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define TANDEM_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem {

// The code point that spells `byte`.
char32_t ByteToMappedCodePoint(uint8_t byte);

// The byte spelled by `cp`, or nullopt if `cp` is not one of the 256 mapped code points.
std::optional<uint8_t> MappedCodePointToByte(char32_t cp);

// Spells every byte of `bytes` in the mapped alphabet (valid UTF-8 output).
std::string ByteLevelEncode(std::string_view bytes);

// Inverse of ByteLevelEncode. Fails with InvalidArgument naming the byte offset if `mapped` is not
// valid UTF-8 or holds a code point outside the mapped alphabet.
absl::StatusOr<std::string> ByteLevelDecode(std::string_view mapped);

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_BYTE_LEVEL_H_
