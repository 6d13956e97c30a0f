#include "common/tokenizer/byte_level.h"

#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/utf8.h"

namespace tandem {
namespace {

bool MapsToItself(int byte) {
  return (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

struct ByteLevelTables {
  std::array<char32_t, 256> byte_to_cp;
  // Every mapped code point is below 0x100 + 68; index by code point.
  std::array<int16_t, 0x200> cp_to_byte;
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables tables = [] {
    ByteLevelTables t;
    t.cp_to_byte.fill(-1);
    char32_t next_shifted = 0x100;
    for (int byte = 0; byte < 256; ++byte) {
      const char32_t cp = MapsToItself(byte) ? static_cast<char32_t>(byte) : next_shifted++;
      t.byte_to_cp[byte] = cp;
      t.cp_to_byte[cp] = static_cast<int16_t>(byte);
    }
    return t;
  }();
  return tables;
}

}  // namespace

char32_t ByteToMappedCodePoint(uint8_t byte) { return Tables().byte_to_cp[byte]; }

std::optional<uint8_t> MappedCodePointToByte(char32_t cp) {
  if (cp >= Tables().cp_to_byte.size()) return std::nullopt;
  const int16_t byte = Tables().cp_to_byte[cp];
  if (byte < 0) return std::nullopt;
  return static_cast<uint8_t>(byte);
}

std::string ByteLevelEncode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(ByteToMappedCodePoint(static_cast<uint8_t>(c)), &out);
  return out;
}

absl::StatusOr<std::string> ByteLevelDecode(std::string_view mapped) {
  std::string out;
  out.reserve(mapped.size());
  for (size_t offset = 0; offset < mapped.size();) {
    const Utf8Step step = DecodeUtf8Step(mapped, offset);
    if (!step.valid) {
      return absl::InvalidArgumentError(absl::StrFormat("invalid UTF-8 at byte offset %d", offset));
    }
    const std::optional<uint8_t> byte = MappedCodePointToByte(step.code_point);
    if (!byte.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("code point U+%04X at byte offset %d is not in the byte-level alphabet",
                          static_cast<uint32_t>(step.code_point), offset));
    }
    out.push_back(static_cast<char>(*byte));
    offset += step.length;
  }
  return out;
}

}  // namespace tandem
