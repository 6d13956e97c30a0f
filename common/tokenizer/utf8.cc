#include "common/tokenizer/utf8.h"

#include <cstdint>

namespace tandem {

Utf8Step DecodeUtf8Step(std::string_view bytes, size_t offset) {
  const uint8_t lead = static_cast<uint8_t>(bytes[offset]);
  if (lead < 0x80) return {lead, 1, true, false};
  // Table 3-7: the number of continuation bytes and the allowed range of the first one.
  int continuation_count;
  uint8_t second_low = 0x80, second_high = 0xBF;
  char32_t cp;
  if (lead >= 0xC2 && lead <= 0xDF) {
    continuation_count = 1;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    continuation_count = 2;
    cp = lead & 0x0F;
    if (lead == 0xE0) second_low = 0xA0;   // no overlongs
    if (lead == 0xED) second_high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    continuation_count = 3;
    cp = lead & 0x07;
    if (lead == 0xF0) second_low = 0x90;   // no overlongs
    if (lead == 0xF4) second_high = 0x8F;  // nothing above U+10FFFF
  } else {
    return {kReplacementCharacter, 1, false, false};  // 80..C1, F5..FF never start a sequence
  }
  for (int k = 1; k <= continuation_count; ++k) {
    if (offset + k >= bytes.size()) return {kReplacementCharacter, k, false, true};
    const uint8_t byte = static_cast<uint8_t>(bytes[offset + k]);
    const uint8_t low = k == 1 ? second_low : 0x80;
    const uint8_t high = k == 1 ? second_high : 0xBF;
    if (byte < low || byte > high) return {kReplacementCharacter, k, false, false};
    cp = (cp << 6) | (byte & 0x3F);
  }
  return {cp, continuation_count + 1, true, false};
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Sanitizes bytes[0, end) into *out and returns where it stopped: bytes.size() when
// hold_incomplete_tail is false, else the start of an incomplete tail that later bytes may finish.
size_t SanitizeInto(std::string_view bytes, bool hold_incomplete_tail, std::string* out) {
  size_t offset = 0;
  while (offset < bytes.size()) {
    const Utf8Step step = DecodeUtf8Step(bytes, offset);
    if (step.valid) {
      out->append(bytes.data() + offset, step.length);
    } else if (step.truncated && hold_incomplete_tail) {
      return offset;
    } else {
      AppendUtf8(kReplacementCharacter, out);
    }
    offset += step.length;
  }
  return offset;
}

}  // namespace

std::string SanitizeUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  SanitizeInto(bytes, /*hold_incomplete_tail=*/false, &out);
  return out;
}

std::string Utf8StreamSanitizer::Push(std::string_view bytes) {
  // The decision at any offset depends only on the bytes from there on, and a decision is final
  // unless the input ended inside the sequence (truncated). So re-scanning the held tail together
  // with the new bytes gives the same cuts as scanning the whole stream at once.
  pending_.append(bytes.data(), bytes.size());
  std::string out;
  const size_t held_from = SanitizeInto(pending_, /*hold_incomplete_tail=*/true, &out);
  pending_.erase(0, held_from);
  return out;
}

std::string Utf8StreamSanitizer::Finish() {
  std::string out;
  SanitizeInto(pending_, /*hold_incomplete_tail=*/false, &out);
  pending_.clear();
  return out;
}

}  // namespace tandem
