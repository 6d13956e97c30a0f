#include "common/gguf/gguf_value.h"

#include <bit>
#include <limits>
#include <utility>

namespace tandem {

// Packed arrays and scalar bits are kept in the file's byte order, which is the host's.
static_assert(std::endian::native == std::endian::little, "Tandem's GGUF code assumes a little-endian host");

bool IsValidGgufType(uint32_t id) { return id <= static_cast<uint32_t>(GgufType::kF64); }

std::string GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return absl::StrCat("type#", static_cast<uint32_t>(type));
}

int GgufScalarSize(GgufType type) {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool: return 1;
    case GgufType::kU16:
    case GgufType::kI16: return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32: return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64: return 8;
    case GgufType::kString:
    case GgufType::kArray: return 0;
  }
  return 0;
}

bool IsGgufIntegerType(GgufType type) {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64: return true;
    default: return false;
  }
}

namespace {

// The integer held in `bits` (a value of integer type `type`), or OutOfRange for a u64 that does
// not fit in int64.
absl::StatusOr<int64_t> IntegerFromBits(GgufType type, uint64_t bits) {
  switch (type) {
    case GgufType::kU8: return static_cast<int64_t>(static_cast<uint8_t>(bits));
    case GgufType::kI8: return static_cast<int64_t>(static_cast<int8_t>(bits));
    case GgufType::kU16: return static_cast<int64_t>(static_cast<uint16_t>(bits));
    case GgufType::kI16: return static_cast<int64_t>(static_cast<int16_t>(bits));
    case GgufType::kU32: return static_cast<int64_t>(static_cast<uint32_t>(bits));
    case GgufType::kI32: return static_cast<int64_t>(static_cast<int32_t>(bits));
    case GgufType::kI64: return static_cast<int64_t>(bits);
    case GgufType::kU64:
      if (bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::OutOfRangeError(absl::StrCat("u64 value ", bits, " does not fit in int64"));
      }
      return static_cast<int64_t>(bits);
    default:
      return absl::FailedPreconditionError(absl::StrCat("expected an integer, found ", GgufTypeName(type)));
  }
}

}  // namespace

GgufValue GgufValue::String(std::string s) {
  GgufValue out(GgufType::kString);
  out.string_ = std::move(s);
  return out;
}

GgufValue GgufValue::BoolArray(const std::vector<bool>& elements) {
  GgufValue out(GgufType::kArray);
  out.element_type_ = GgufType::kBool;
  out.size_ = elements.size();
  out.packed_.reserve(elements.size());
  for (bool b : elements) out.packed_.push_back(b ? 1 : 0);
  return out;
}

GgufValue GgufValue::StringArray(std::vector<std::string> elements) {
  GgufValue out(GgufType::kArray);
  out.element_type_ = GgufType::kString;
  out.size_ = elements.size();
  out.strings_ = std::move(elements);
  return out;
}

GgufValue GgufValue::ArrayOfArrays(std::vector<GgufValue> arrays) {
  GgufValue out(GgufType::kArray);
  out.element_type_ = GgufType::kArray;
  out.size_ = arrays.size();
  out.arrays_ = std::move(arrays);
  return out;
}

GgufValue GgufValue::EmptyArray(GgufType element_type) {
  GgufValue out(GgufType::kArray);
  out.element_type_ = element_type;
  return out;
}

absl::StatusOr<int64_t> GgufValue::ToInt() const { return IntegerFromBits(type_, bits_); }

absl::StatusOr<double> GgufValue::ToFloat() const {
  if (type_ == GgufType::kF32) return static_cast<double>(ScalarFromBits<float>(bits_));
  if (type_ == GgufType::kF64) return ScalarFromBits<double>(bits_);
  return absl::FailedPreconditionError(absl::StrCat("expected f32 or f64, found ", GgufTypeName(type_)));
}

uint64_t GgufValue::PackedBits(uint64_t i) const {
  const int width = GgufScalarSize(element_type_);
  uint64_t bits = 0;
  std::memcpy(&bits, packed_.data() + i * width, width);
  return bits;
}

GgufValue GgufValue::ElementAt(uint64_t i) const {
  switch (element_type_) {
    case GgufType::kString: return String(strings_[i]);
    case GgufType::kArray: return arrays_[i];
    default: {
      GgufValue out(element_type_);
      out.bits_ = PackedBits(i);
      return out;
    }
  }
}

absl::StatusOr<absl::Span<const std::string>> GgufValue::GetStringArray() const {
  if (absl::Status s = ArrayTypeCheck(GgufType::kString); !s.ok()) return s;
  return absl::Span<const std::string>(strings_);
}

absl::StatusOr<std::vector<int64_t>> GgufValue::ToIntArray() const {
  if (type_ != GgufType::kArray) {
    return absl::FailedPreconditionError(absl::StrCat("expected an array, found ", GgufTypeName(type_)));
  }
  if (!IsGgufIntegerType(element_type_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("expected an array of integers, found an array of ", GgufTypeName(element_type_)));
  }
  std::vector<int64_t> out;
  out.reserve(size_);
  for (uint64_t i = 0; i < size_; ++i) {
    absl::StatusOr<int64_t> v = IntegerFromBits(element_type_, PackedBits(i));
    if (!v.ok()) return absl::OutOfRangeError(absl::StrCat("element ", i, ": ", v.status().message()));
    out.push_back(*v);
  }
  return out;
}

absl::Status GgufValue::TypeError(GgufType expected) const {
  return absl::FailedPreconditionError(
      absl::StrCat("expected ", GgufTypeName(expected), ", found ", GgufTypeName(type_)));
}

absl::Status GgufValue::ArrayTypeCheck(GgufType expected_element) const {
  if (type_ != GgufType::kArray) {
    return absl::FailedPreconditionError(absl::StrCat("expected an array of ", GgufTypeName(expected_element),
                                                      ", found ", GgufTypeName(type_)));
  }
  if (element_type_ != expected_element) {
    return absl::FailedPreconditionError(absl::StrCat("expected an array of ", GgufTypeName(expected_element),
                                                      ", found an array of ", GgufTypeName(element_type_)));
  }
  return absl::OkStatus();
}

bool operator==(const GgufValue& a, const GgufValue& b) {
  if (a.type_ != b.type_) return false;
  if (a.type_ == GgufType::kString) return a.string_ == b.string_;
  if (a.type_ != GgufType::kArray) return a.bits_ == b.bits_;
  return a.element_type_ == b.element_type_ && a.size_ == b.size_ && a.packed_ == b.packed_ &&
         a.strings_ == b.strings_ && a.arrays_ == b.arrays_;
}

}  // namespace tandem
