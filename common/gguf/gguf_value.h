// One GGUF metadata value: a scalar, a string, or an array (of scalars, of strings, or of arrays).
//
// Values are plain data with value semantics. The reader (gguf_file.h) produces them and the writer
// (gguf_writer.h) consumes them; the factories below build them. Arrays of scalars are stored packed
// (as in the file, little-endian), so a 150k-entry score table costs 600 KB, not 150k objects.
#ifndef TANDEM_COMMON_GGUF_GGUF_VALUE_H_
#define TANDEM_COMMON_GGUF_GGUF_VALUE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace tandem {

// gguf_metadata_value_type; the numeric values are part of the format.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// True for the 13 ids above.
bool IsValidGgufType(uint32_t id);
// "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64";
// "type#<id>" for an id outside the enum.
std::string GgufTypeName(GgufType type);
// Bytes one value of a scalar type takes in the file; 0 for kString and kArray.
int GgufScalarSize(GgufType type);
bool IsGgufIntegerType(GgufType type);

// The GgufType that stores a C++ type: uint8_t..int64_t, float, double, bool.
template <typename T>
struct GgufTypeOf;
template <> struct GgufTypeOf<uint8_t> { static constexpr GgufType value = GgufType::kU8; };
template <> struct GgufTypeOf<int8_t> { static constexpr GgufType value = GgufType::kI8; };
template <> struct GgufTypeOf<uint16_t> { static constexpr GgufType value = GgufType::kU16; };
template <> struct GgufTypeOf<int16_t> { static constexpr GgufType value = GgufType::kI16; };
template <> struct GgufTypeOf<uint32_t> { static constexpr GgufType value = GgufType::kU32; };
template <> struct GgufTypeOf<int32_t> { static constexpr GgufType value = GgufType::kI32; };
template <> struct GgufTypeOf<float> { static constexpr GgufType value = GgufType::kF32; };
template <> struct GgufTypeOf<bool> { static constexpr GgufType value = GgufType::kBool; };
template <> struct GgufTypeOf<uint64_t> { static constexpr GgufType value = GgufType::kU64; };
template <> struct GgufTypeOf<int64_t> { static constexpr GgufType value = GgufType::kI64; };
template <> struct GgufTypeOf<double> { static constexpr GgufType value = GgufType::kF64; };

class GgufValue {
 public:
  // A u8 zero; exists so that containers of values can be resized.
  GgufValue() = default;

  // Scalars and strings.
  template <typename T>
  static GgufValue Scalar(T v) {
    GgufValue out(GgufTypeOf<T>::value);
    if constexpr (std::is_same_v<T, bool>) {
      out.bits_ = v ? 1 : 0;
    } else {
      std::memcpy(&out.bits_, &v, sizeof(T));
    }
    return out;
  }
  static GgufValue String(std::string s);

  // Arrays. Element types are fixed by the C++ type (uint8_t -> u8 ... double -> f64).
  template <typename T>
  static GgufValue Array(absl::Span<const T> elements) {
    GgufValue out(GgufType::kArray);
    out.element_type_ = GgufTypeOf<T>::value;
    out.size_ = elements.size();
    out.packed_.resize(elements.size() * sizeof(T));
    if (!elements.empty()) std::memcpy(out.packed_.data(), elements.data(), out.packed_.size());
    return out;
  }
  template <typename T>
  static GgufValue Array(const std::vector<T>& elements) {
    return Array(absl::Span<const T>(elements));
  }
  static GgufValue BoolArray(const std::vector<bool>& elements);
  static GgufValue StringArray(std::vector<std::string> elements);
  // An array whose elements are arrays (each with its own element type and length).
  static GgufValue ArrayOfArrays(std::vector<GgufValue> arrays);
  // An empty array of the given element type (any type, kArray included).
  static GgufValue EmptyArray(GgufType element_type);

  GgufType type() const { return type_; }

  // Exact-type access: T must be the stored type (uint32_t for u32, std::string for string, ...);
  // otherwise FailedPrecondition "expected u32, found i32".
  template <typename T>
  absl::StatusOr<T> Get() const {
    if constexpr (std::is_same_v<T, std::string>) {
      if (type_ != GgufType::kString) return TypeError(GgufType::kString);
      return string_;
    } else {
      if (type_ != GgufTypeOf<T>::value) return TypeError(GgufTypeOf<T>::value);
      return ScalarFromBits<T>(bits_);
    }
  }
  // Tolerant access: any of the eight integer types, as int64 (u64 above INT64_MAX: OutOfRange).
  absl::StatusOr<int64_t> ToInt() const;
  // Tolerant access: f32 or f64, as double.
  absl::StatusOr<double> ToFloat() const;
  // The string of a kString value; nullptr for any other type.
  const std::string* AsString() const { return type_ == GgufType::kString ? &string_ : nullptr; }

  // Arrays (type() == kArray). On other types array_size() is 0.
  GgufType element_type() const { return element_type_; }
  uint64_t array_size() const { return size_; }
  // Element i (< array_size()) as a value of its own; copies a string or nested array.
  GgufValue ElementAt(uint64_t i) const;
  // Element i of an array of arrays, without copying (precondition: element_type() == kArray).
  const GgufValue& ArrayAt(uint64_t i) const { return arrays_[i]; }
  // Exact element type: T must match element_type() (FailedPrecondition otherwise).
  template <typename T>
  absl::StatusOr<std::vector<T>> GetArray() const {
    if (absl::Status s = ArrayTypeCheck(GgufTypeOf<T>::value); !s.ok()) return s;
    std::vector<T> out(size_);
    for (uint64_t i = 0; i < size_; ++i) out[i] = ScalarFromBits<T>(PackedBits(i));
    return out;
  }
  absl::StatusOr<absl::Span<const std::string>> GetStringArray() const;
  // Tolerant: any integer element type, as int64 (out-of-range u64 elements: OutOfRange).
  absl::StatusOr<std::vector<int64_t>> ToIntArray() const;

  // The scalar's stored bits, zero-extended (for the writer and for formatting).
  uint64_t scalar_bits() const { return bits_; }
  // Packed element bytes of an array of scalars (little-endian, as in the file).
  const std::vector<uint8_t>& packed_elements() const { return packed_; }

  friend bool operator==(const GgufValue& a, const GgufValue& b);

 private:
  friend class GgufCursor;  // builds values in place while reading a file (gguf_codec.h)

  explicit GgufValue(GgufType type) : type_(type) {}
  template <typename T>
  static T ScalarFromBits(uint64_t bits) {
    if constexpr (std::is_same_v<T, bool>) {
      return bits != 0;
    } else {
      T v;
      std::memcpy(&v, &bits, sizeof(T));
      return v;
    }
  }
  uint64_t PackedBits(uint64_t i) const;
  absl::Status TypeError(GgufType expected) const;
  absl::Status ArrayTypeCheck(GgufType expected_element) const;

  GgufType type_ = GgufType::kU8;
  uint64_t bits_ = 0;                      // scalars
  std::string string_;                     // kString
  GgufType element_type_ = GgufType::kU8;  // kArray
  uint64_t size_ = 0;                      // kArray: element count
  std::vector<uint8_t> packed_;            // kArray of scalars
  std::vector<std::string> strings_;       // kArray of strings
  std::vector<GgufValue> arrays_;          // kArray of arrays
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GGUF_GGUF_VALUE_H_
