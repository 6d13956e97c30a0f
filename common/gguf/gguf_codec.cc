#include "common/gguf/gguf_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// The fewest bytes one array element of `type` can take in a file: used to refuse a lying element
// count before anything is allocated for it.
uint64_t MinEncodedSize(GgufType type) {
  switch (type) {
    case GgufType::kString: return 8;   // u64 length, no bytes
    case GgufType::kArray: return 12;   // u32 element type + u64 length
    default: return static_cast<uint64_t>(GgufScalarSize(type));
  }
}

}  // namespace

absl::Status GgufCursor::Error(std::string_view field, uint64_t offset, std::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat(context_, context_.empty() ? "" : ": ", std::string(field),
                                                 " at byte ", offset, ": ", std::string(what)));
}

absl::Status GgufCursor::Need(std::string_view field, uint64_t n) const {
  if (n <= remaining()) return absl::OkStatus();
  return Error(field, pos_, absl::StrCat("needs ", n, " bytes but the file ends after ", remaining()));
}

absl::Status GgufCursor::ReadU32(std::string_view field, uint32_t* out) {
  if (absl::Status s = Need(field, 4); !s.ok()) return s;
  std::memcpy(out, data_ + pos_, 4);
  pos_ += 4;
  return absl::OkStatus();
}

absl::Status GgufCursor::ReadU64(std::string_view field, uint64_t* out) {
  if (absl::Status s = Need(field, 8); !s.ok()) return s;
  std::memcpy(out, data_ + pos_, 8);
  pos_ += 8;
  return absl::OkStatus();
}

absl::Status GgufCursor::ReadBytes(std::string_view field, uint64_t n, const uint8_t** out) {
  if (absl::Status s = Need(field, n); !s.ok()) return s;
  *out = data_ + pos_;
  pos_ += n;
  return absl::OkStatus();
}

absl::Status GgufCursor::ReadString(std::string_view field, std::string* out) {
  const uint64_t at = pos_;
  // Field names are built only on error: a vocabulary holds hundreds of thousands of strings.
  if (remaining() < 8) return Need(absl::StrCat(std::string(field), " length"), 8);
  uint64_t length = 0;
  std::memcpy(&length, data_ + pos_, 8);
  pos_ += 8;
  if (length > remaining()) {
    return Error(absl::StrCat(std::string(field), " length"), at,
                 absl::StrCat("length ", length, " runs past the end of the file (", remaining(), " bytes left)"));
  }
  out->assign(reinterpret_cast<const char*>(data_ + pos_), length);
  pos_ += length;
  return absl::OkStatus();
}

absl::Status GgufCursor::ReadValue(GgufType type, int depth, GgufValue* out) {
  *out = GgufValue(type);
  switch (type) {
    case GgufType::kString: return ReadString("string value", &out->string_);
    case GgufType::kArray: return ReadArray(depth + 1, out);
    default: break;
  }
  const uint64_t at = pos_;
  const int width = GgufScalarSize(type);
  if (remaining() < static_cast<uint64_t>(width)) return Need(absl::StrCat(GgufTypeName(type), " value"), width);
  std::memcpy(&out->bits_, data_ + pos_, width);
  pos_ += width;
  if (type == GgufType::kBool && out->bits_ > 1) {
    return Error("bool value", at, absl::StrCat("is ", out->bits_, " (must be 0 or 1)"));
  }
  return absl::OkStatus();
}

absl::Status GgufCursor::ReadArray(int depth, GgufValue* out) {
  const uint64_t type_at = pos_;
  uint32_t element_type = 0;
  if (absl::Status s = ReadU32("array element type", &element_type); !s.ok()) return s;
  if (!IsValidGgufType(element_type)) {
    return Error("array element type", type_at, absl::StrCat("unknown value type id ", element_type));
  }
  if (element_type == static_cast<uint32_t>(GgufType::kArray) && depth >= kGgufMaxArrayDepth) {
    return Error("array element type", type_at,
                 absl::StrCat("arrays nested deeper than ", kGgufMaxArrayDepth, " levels"));
  }
  const uint64_t length_at = pos_;
  uint64_t length = 0;
  if (absl::Status s = ReadU64("array length", &length); !s.ok()) return s;
  const GgufType type = static_cast<GgufType>(element_type);
  const uint64_t min_size = MinEncodedSize(type);
  if (length > remaining() / min_size) {
    return Error("array length", length_at,
                 absl::StrCat(length, " elements of ", GgufTypeName(type), " cannot fit in the ", remaining(),
                              " bytes left"));
  }
  out->element_type_ = type;
  out->size_ = length;
  if (type == GgufType::kString) {
    out->strings_.resize(length);
    for (uint64_t i = 0; i < length; ++i) {
      if (absl::Status s = ReadString("string element", &out->strings_[i]); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(s.message(), " (array element ", i, ")"));
      }
    }
  } else if (type == GgufType::kArray) {
    out->arrays_.resize(length);
    for (uint64_t i = 0; i < length; ++i) {
      if (absl::Status s = ReadArray(depth + 1, &out->arrays_[i]); !s.ok()) return s;
      out->arrays_[i].type_ = GgufType::kArray;
    }
  } else {
    const uint64_t at = pos_;
    const uint8_t* bytes = nullptr;
    if (absl::Status s = ReadBytes("array elements", length * min_size, &bytes); !s.ok()) return s;
    out->packed_.assign(bytes, bytes + length * min_size);
    if (type == GgufType::kBool) {
      for (uint64_t i = 0; i < length; ++i) {
        if (bytes[i] > 1) {
          return Error(absl::StrCat("bool array element ", i), at + i,
                       absl::StrCat("is ", bytes[i], " (must be 0 or 1)"));
        }
      }
    }
  }
  return absl::OkStatus();
}

void AppendGgufU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }

void AppendGgufU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }

void AppendGgufString(std::string* out, std::string_view s) {
  AppendGgufU64(out, s.size());
  out->append(s.data(), s.size());
}

namespace {

// The value without its type tag.
void AppendUntagged(std::string* out, const GgufValue& value) {
  switch (value.type()) {
    case GgufType::kString: AppendGgufString(out, *value.AsString()); return;
    case GgufType::kArray: {
      AppendGgufU32(out, static_cast<uint32_t>(value.element_type()));
      AppendGgufU64(out, value.array_size());
      if (value.element_type() == GgufType::kString) {
        const absl::Span<const std::string> strings = *value.GetStringArray();
        for (const std::string& s : strings) AppendGgufString(out, s);
      } else if (value.element_type() == GgufType::kArray) {
        for (uint64_t i = 0; i < value.array_size(); ++i) AppendUntagged(out, value.ArrayAt(i));
      } else {
        const std::vector<uint8_t>& packed = value.packed_elements();
        out->append(reinterpret_cast<const char*>(packed.data()), packed.size());
      }
      return;
    }
    default: {
      const uint64_t bits = value.scalar_bits();
      out->append(reinterpret_cast<const char*>(&bits), GgufScalarSize(value.type()));
      return;
    }
  }
}

}  // namespace

void AppendGgufTypedValue(std::string* out, const GgufValue& value) {
  AppendGgufU32(out, static_cast<uint32_t>(value.type()));
  AppendUntagged(out, value);
}

}  // namespace tandem
