// The byte-level encoding of GGUF shared by the reader and the writer (internal to tandem_gguf).
//
// GgufCursor reads little-endian fields from a bounded byte range and never reads past its end:
// every read checks the bytes left first, and its errors name the field, the byte offset and what
// was being read (the cursor's context, e.g. "metadata key 'general.name'").
#ifndef TANDEM_COMMON_GGUF_GGUF_CODEC_H_
#define TANDEM_COMMON_GGUF_GGUF_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/gguf/gguf_value.h"

namespace tandem {

// The file starts with these four bytes ("GGUF").
inline constexpr char kGgufMagic[4] = {'G', 'G', 'U', 'F'};
inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr std::string_view kGgufAlignmentKey = "general.alignment";
// Deepest nesting of arrays accepted (an array of arrays is depth 2); real files use 1.
inline constexpr int kGgufMaxArrayDepth = 8;

class GgufCursor {
 public:
  GgufCursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  // What is being read; prefixes every error message.
  void set_context(std::string context) { context_ = std::move(context); }

  absl::Status ReadU32(std::string_view field, uint32_t* out);
  absl::Status ReadU64(std::string_view field, uint64_t* out);
  // Reads n bytes without copying; *out points into the range.
  absl::Status ReadBytes(std::string_view field, uint64_t n, const uint8_t** out);
  // A GGUF string: u64 length then the bytes.
  absl::Status ReadString(std::string_view field, std::string* out);
  // Reads one value of `type` (the type tag itself already read). depth counts enclosing arrays.
  absl::Status ReadValue(GgufType type, int depth, GgufValue* out);

  // An error "<context>: <field> at byte <offset>: <what>" (InvalidArgument).
  absl::Status Error(std::string_view field, uint64_t offset, std::string_view what) const;

 private:
  absl::Status Need(std::string_view field, uint64_t n) const;
  absl::Status ReadArray(int depth, GgufValue* out);

  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string context_;
};

// Appends the encodings (little-endian) used by the writer.
void AppendGgufU32(std::string* out, uint32_t v);
void AppendGgufU64(std::string* out, uint64_t v);
void AppendGgufString(std::string* out, std::string_view s);
// The value's type tag followed by the value.
void AppendGgufTypedValue(std::string* out, const GgufValue& value);

}  // namespace tandem

#endif  // TANDEM_COMMON_GGUF_GGUF_CODEC_H_
