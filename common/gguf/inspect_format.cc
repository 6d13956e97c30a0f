#include "common/gguf/inspect_format.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace {

constexpr size_t kTextStringBytes = 120;

// Length of the valid UTF-8 sequence starting at s[i], or 0 if the bytes there are not one.
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  size_t n = 0;
  uint32_t min_code = 0;
  uint32_t code = 0;
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) { n = 2; code = c & 0x1f; min_code = 0x80; }
  else if ((c & 0xf0) == 0xe0) { n = 3; code = c & 0x0f; min_code = 0x800; }
  else if ((c & 0xf8) == 0xf0) { n = 4; code = c & 0x07; min_code = 0x10000; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3f);
  }
  if (code < min_code || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return 0;
  return n;
}

std::string ScalarText(const GgufValue& v, bool json) {
  const uint64_t bits = v.scalar_bits();
  switch (v.type()) {
    case GgufType::kBool: return bits != 0 ? "true" : "false";
    case GgufType::kF32:
    case GgufType::kF64: {
      const double d = *v.ToFloat();
      if (!std::isfinite(d)) return json ? "null" : absl::StrCat(d);
      const bool f32 = v.type() == GgufType::kF32;
      // JSON keeps every bit (round-trip precision); text is for reading.
      if (json) return f32 ? absl::StrFormat("%.9g", d) : absl::StrFormat("%.17g", d);
      return f32 ? absl::StrFormat("%.7g", d) : absl::StrFormat("%.15g", d);
    }
    case GgufType::kU64: return absl::StrCat(bits);
    default: return absl::StrCat(*v.ToInt());
  }
}

// `s` with quotes, backslashes and control bytes escaped, cut at kTextStringBytes.
std::string TextEscape(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, kTextStringBytes)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          absl::StrAppend(&out, absl::StrFormat("\\x%02x", static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  if (s.size() > kTextStringBytes) absl::StrAppend(&out, "...(", s.size(), " bytes)");
  return out;
}

std::string TextQuote(std::string_view s) { return absl::StrCat("\"", TextEscape(s), "\""); }

std::string ArrayTypeText(const GgufValue& v) {
  return absl::StrCat("array<", GgufTypeName(v.element_type()), ">[", v.array_size(), "]");
}

void AppendValueText(std::string* out, const GgufValue& v) {
  if (v.type() == GgufType::kString) {
    out->append(TextQuote(*v.AsString()));
  } else if (v.type() != GgufType::kArray) {
    out->append(ScalarText(v, /*json=*/false));
  } else {
    out->append("[");
    const uint64_t shown = std::min<uint64_t>(v.array_size(), kInspectArrayElements);
    for (uint64_t i = 0; i < shown; ++i) {
      if (i > 0) out->append(", ");
      if (v.element_type() == GgufType::kArray) {
        const GgufValue& inner = v.ArrayAt(i);
        absl::StrAppend(out, ArrayTypeText(inner), " ");
        AppendValueText(out, inner);
      } else {
        AppendValueText(out, v.ElementAt(i));
      }
    }
    if (shown < v.array_size()) out->append(shown > 0 ? ", ..." : "...");
    out->append("]");
  }
}

void AppendValueJson(std::string* out, const GgufValue& v);

// {"element_type", "length", "first"} (the members of an array's summary, without braces).
void AppendArrayJsonMembers(std::string* out, const GgufValue& v) {
  absl::StrAppend(out, "\"element_type\": \"", GgufTypeName(v.element_type()), "\", \"length\": ", v.array_size(),
                  ", \"first\": [");
  const uint64_t shown = std::min<uint64_t>(v.array_size(), kInspectArrayElements);
  for (uint64_t i = 0; i < shown; ++i) {
    if (i > 0) out->append(", ");
    if (v.element_type() == GgufType::kArray) {
      out->append("{");
      AppendArrayJsonMembers(out, v.ArrayAt(i));
      out->append("}");
    } else {
      AppendValueJson(out, v.ElementAt(i));
    }
  }
  out->append("]");
}

void AppendValueJson(std::string* out, const GgufValue& v) {
  if (v.type() == GgufType::kString) {
    out->append(JsonQuote(*v.AsString()));
  } else if (v.type() == GgufType::kArray) {
    out->append("{");
    AppendArrayJsonMembers(out, v);
    out->append("}");
  } else {
    out->append(ScalarText(v, /*json=*/true));
  }
}

std::string ShapeText(const GgufTensorInfo& t) {
  std::string out = "[";
  for (int d = 0; d < t.n_dims; ++d) absl::StrAppend(&out, d > 0 ? ", " : "", t.ne[d]);
  return out + "]";
}

// 1536 -> "1.50 KiB"; bytes below 1 KiB as "N B".
std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (v >= 1024 && unit < 3) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", v, kUnits[unit]);
}

struct TypeTotal {
  std::string name;
  uint64_t count = 0;
  uint64_t bytes = 0;
};

// Per ggml type id, in id order.
std::map<uint32_t, TypeTotal> TotalsByType(const GgufFile& file) {
  std::map<uint32_t, TypeTotal> totals;
  for (const GgufTensorInfo& t : file.tensors()) {
    TypeTotal& total = totals[t.ggml_type];
    total.name = std::string(t.type_info->name);
    ++total.count;
    total.bytes += t.n_bytes;
  }
  return totals;
}

uint64_t TotalBytes(const GgufFile& file) {
  uint64_t bytes = 0;
  for (const GgufTensorInfo& t : file.tensors()) bytes += t.n_bytes;
  return bytes;
}

}  // namespace

std::string JsonQuote(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(s.substr(i, n));
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", c));
    } else {
      out += static_cast<char>(c);
    }
    i += n;
  }
  return out + "\"";
}

std::string FormatGgufValueText(const GgufValue& value) {
  std::string out;
  if (value.type() == GgufType::kArray) absl::StrAppend(&out, ArrayTypeText(value), " ");
  AppendValueText(&out, value);
  return out;
}

std::string FormatGgufText(const GgufFile& file) {
  std::string out;
  absl::StrAppend(&out, file.source(), "\n");
  absl::StrAppend(&out, "GGUF version ", file.version(), ", alignment ", file.alignment(), ", ", file.file_size(),
                  " bytes, tensor data at byte ", file.data_offset(), "\n\n");
  absl::StrAppend(&out, "metadata (", file.metadata().size(), " keys):\n");
  size_t key_width = 0;
  for (const GgufMetadataEntry& e : file.metadata()) key_width = std::max(key_width, std::min<size_t>(e.key.size(), 60));
  for (const GgufMetadataEntry& e : file.metadata()) {
    const std::string type = e.value.type() == GgufType::kArray ? "array" : GgufTypeName(e.value.type());
    absl::StrAppend(&out, absl::StrFormat("  %-*s %-6s ", static_cast<int>(key_width), TextEscape(e.key), type),
                    FormatGgufValueText(e.value), "\n");
  }

  absl::StrAppend(&out, "\ntensors (", file.tensors().size(), "):\n");
  size_t name_width = 4;
  for (const GgufTensorInfo& t : file.tensors()) name_width = std::max(name_width, std::min<size_t>(t.name.size(), 60));
  absl::StrAppend(&out, absl::StrFormat("  %-*s %-8s %-28s %14s %14s\n", static_cast<int>(name_width), "name", "type", "shape", "bytes",
                                        "offset"));
  for (const GgufTensorInfo& t : file.tensors()) {
    absl::StrAppend(&out, absl::StrFormat("  %-*s %-8s %-28s %14d %14d\n", static_cast<int>(name_width), TextEscape(t.name),
                                          std::string(t.type_info->name), ShapeText(t), t.n_bytes, t.offset));
  }

  absl::StrAppend(&out, "\ntotals by type:\n");
  for (const auto& [id, total] : TotalsByType(file)) {
    absl::StrAppend(&out, absl::StrFormat("  %-8s %6d tensors %16d bytes  %s\n", total.name, total.count, total.bytes,
                                          HumanBytes(total.bytes)));
  }
  const uint64_t bytes = TotalBytes(file);
  absl::StrAppend(&out, absl::StrFormat("total: %d tensors, %d bytes (%s)\n", file.tensors().size(), bytes, HumanBytes(bytes)));
  return out;
}

std::string FormatGgufJson(const GgufFile& file) {
  std::string out = "{";
  absl::StrAppend(&out, "\"file\": ", JsonQuote(file.source()), ", \"version\": ", file.version(),
                  ", \"alignment\": ", file.alignment(), ", \"file_size\": ", file.file_size(),
                  ", \"data_offset\": ", file.data_offset(), ",\n \"metadata\": [");
  bool first = true;
  for (const GgufMetadataEntry& e : file.metadata()) {
    absl::StrAppend(&out, first ? "\n  " : ",\n  ", "{\"key\": ", JsonQuote(e.key), ", \"type\": \"",
                    GgufTypeName(e.value.type()), "\", ");
    if (e.value.type() == GgufType::kArray) {
      AppendArrayJsonMembers(&out, e.value);
    } else {
      out += "\"value\": ";
      AppendValueJson(&out, e.value);
    }
    out += "}";
    first = false;
  }
  out += "],\n \"tensors\": [";
  first = true;
  for (const GgufTensorInfo& t : file.tensors()) {
    std::string shape;
    for (int d = 0; d < t.n_dims; ++d) absl::StrAppend(&shape, d > 0 ? ", " : "", t.ne[d]);
    absl::StrAppend(&out, first ? "\n  " : ",\n  ", "{\"name\": ", JsonQuote(t.name), ", \"type\": \"",
                    std::string(t.type_info->name), "\", \"type_id\": ", t.ggml_type, ", \"shape\": [", shape,
                    "], \"elements\": ", t.n_elements, ", \"bytes\": ", t.n_bytes, ", \"offset\": ", t.offset,
                    ", \"file_offset\": ", t.file_offset, "}");
    first = false;
  }
  out += "],\n \"totals_by_type\": [";
  first = true;
  for (const auto& [id, total] : TotalsByType(file)) {
    absl::StrAppend(&out, first ? "" : ", ", "{\"type\": \"", total.name, "\", \"count\": ", total.count,
                    ", \"bytes\": ", total.bytes, "}");
    first = false;
  }
  absl::StrAppend(&out, "],\n \"total\": {\"count\": ", file.tensors().size(), ", \"bytes\": ", TotalBytes(file),
                  "}}\n");
  return out;
}

}  // namespace tandem
