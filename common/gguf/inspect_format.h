// What `tandem inspect` prints about a loaded GGUF file, as text for people or JSON for scripts.
#ifndef TANDEM_COMMON_GGUF_INSPECT_FORMAT_H_
#define TANDEM_COMMON_GGUF_INSPECT_FORMAT_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_value.h"

namespace tandem {

// Arrays are summarised by element type, length and this many leading elements.
inline constexpr size_t kInspectArrayElements = 8;

// Version, alignment, metadata (one line per key), a tensor table (name, type, shape, bytes,
// offset), totals per type (count, bytes) and the grand total.
std::string FormatGgufText(const GgufFile& file);
// The same as one JSON object: {"file", "version", "alignment", "file_size", "data_offset",
// "metadata": [{"key", "type", "value"} | {"key", "type": "array", "element_type", "length",
// "first": [...]}], "tensors": [{"name", "type", "type_id", "shape", "elements", "bytes",
// "offset", "file_offset"}], "totals_by_type": [{"type", "count", "bytes"}], "total": {"count",
// "bytes"}}. Strings are complete; non-finite floats are null; invalid UTF-8 becomes U+FFFD.
std::string FormatGgufJson(const GgufFile& file);

// One value in the text form: strings quoted and escaped (cut at 120 bytes), arrays as
// "array<f32>[151936] [0.5, 1, ...]".
std::string FormatGgufValueText(const GgufValue& value);
// `s` as a quoted JSON string.
std::string JsonQuote(std::string_view s);

}  // namespace tandem

#endif  // TANDEM_COMMON_GGUF_INSPECT_FORMAT_H_
