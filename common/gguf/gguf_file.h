// A GGUF file (versions 2 and 3), memory-mapped and fully validated when opened.
//
// Open() maps the file read-only and parses the header, every metadata value and every tensor
// info. Nothing is trusted: counts and lengths are checked against the bytes left before anything
// is allocated; type ids, n_dims (<= 4), shapes (no int64 overflow, ne[0] a whole number of
// blocks), general.alignment (u32, a power of two), tensor offsets (aligned, data inside the file,
// no two tensors overlapping) and duplicate keys / tensor names are all checked. Every format
// error is InvalidArgument and names the field and its byte offset, e.g.
//   "model.gguf: tensor 'blk.0.ffn_up.weight' (info 3): type at byte 1234: unknown ggml type id 77".
// Version 1 files (32-bit counts) and big-endian files are refused with a message saying so.
//
// Tensor data is never copied: GgufTensorInfo::data is a view into the mapping, valid as long as
// the GgufFile lives. A GgufFile is immutable after loading and safe to read from many threads.
#ifndef TANDEM_COMMON_GGUF_GGUF_FILE_H_
#define TANDEM_COMMON_GGUF_GGUF_FILE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_value.h"
#include "common/weights/weight_types.h"

namespace tandem {

class GgufCursor;
class MappedFile;

inline constexpr int kGgufMaxDims = 4;

struct GgufMetadataEntry {
  std::string key;
  GgufValue value;
  uint64_t offset = 0;  // byte where the entry (its key) starts
};

struct GgufTensorInfo {
  std::string name;
  uint32_t ggml_type = 0;                      // ggml type id (enum ggml_type)
  const WeightTypeInfo* type_info = nullptr;   // never null in a loaded file; may be unsupported
  int n_dims = 0;                              // 0..4 (0: a single element)
  std::array<int64_t, kGgufMaxDims> ne = {1, 1, 1, 1};  // ggml order, ne[0] innermost; 1 past n_dims
  int64_t n_elements = 0;
  uint64_t n_bytes = 0;          // from the type table: ne[0] / block_elems * block_bytes * ne[1..3]
  uint64_t offset = 0;           // relative to the data section, as stored (a multiple of alignment)
  uint64_t file_offset = 0;      // absolute byte offset of the data in the file
  uint64_t info_offset = 0;      // byte where this tensor's info record starts
  absl::Span<const uint8_t> data;  // n_bytes bytes inside the file's mapping

  // WeightType of the tensor, when Tandem supports its type (type_info->supported).
  WeightType weight_type() const { return static_cast<WeightType>(ggml_type); }
};

class GgufFile {
 public:
  // Maps and parses the file at `path`. Errors name the path; a missing file is NotFound, other
  // system errors Unavailable, format errors InvalidArgument.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a copy of `bytes` (kept in 4096-byte-aligned storage, like a mapping, so tensor views
  // have the same alignment as from Open). `source` names the bytes in error messages.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(absl::Span<const uint8_t> bytes,
                                                             std::string source = "<memory>");

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& source() const { return source_; }  // the path, or FromBytes' source
  uint32_t version() const { return version_; }          // 2 or 3
  uint32_t alignment() const { return alignment_; }      // general.alignment, default 32
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }  // where the tensor data section starts

  // ---- Metadata ----
  const std::vector<GgufMetadataEntry>& metadata() const { return metadata_; }
  // nullptr when the key is absent.
  const GgufValue* FindValue(std::string_view key) const;
  bool HasKey(std::string_view key) const { return FindValue(key) != nullptr; }

  // Typed getters. Absent key: NotFound "<source>: metadata key 'k' is missing". Wrong type:
  // FailedPrecondition "<source>: metadata key 'k': expected u32, found i32".
  // T is uint8_t..int64_t, float, double, bool or std::string, matched exactly.
  template <typename T>
  absl::StatusOr<T> Get(std::string_view key) const {
    absl::StatusOr<const GgufValue*> v = Lookup(key);
    if (!v.ok()) return v.status();
    absl::StatusOr<T> out = (*v)->Get<T>();
    if (!out.ok()) return KeyError(key, out.status());
    return out;
  }
  absl::StatusOr<uint8_t> GetU8(std::string_view key) const { return Get<uint8_t>(key); }
  absl::StatusOr<int8_t> GetI8(std::string_view key) const { return Get<int8_t>(key); }
  absl::StatusOr<uint16_t> GetU16(std::string_view key) const { return Get<uint16_t>(key); }
  absl::StatusOr<int16_t> GetI16(std::string_view key) const { return Get<int16_t>(key); }
  absl::StatusOr<uint32_t> GetU32(std::string_view key) const { return Get<uint32_t>(key); }
  absl::StatusOr<int32_t> GetI32(std::string_view key) const { return Get<int32_t>(key); }
  absl::StatusOr<uint64_t> GetU64(std::string_view key) const { return Get<uint64_t>(key); }
  absl::StatusOr<int64_t> GetI64(std::string_view key) const { return Get<int64_t>(key); }
  absl::StatusOr<float> GetF32(std::string_view key) const { return Get<float>(key); }
  absl::StatusOr<double> GetF64(std::string_view key) const { return Get<double>(key); }
  absl::StatusOr<bool> GetBool(std::string_view key) const { return Get<bool>(key); }
  absl::StatusOr<std::string> GetString(std::string_view key) const { return Get<std::string>(key); }

  // Tolerant integer: any of the eight integer types, checked to lie in [min, max]
  // (OutOfRange naming the key, the value and the range otherwise). Converters disagree on
  // whether a count is u32, i32 or u64; model-config code should read counts with this.
  absl::StatusOr<int64_t> GetInt(std::string_view key, int64_t min = INT64_MIN, int64_t max = INT64_MAX) const;
  // Tolerant float: f32 or f64, as double.
  absl::StatusOr<double> GetFloat(std::string_view key) const;

  // Arrays. GetArray returns the value itself (type() == kArray; valid while the file lives).
  absl::StatusOr<const GgufValue*> GetArray(std::string_view key) const;
  // Exact element type (T as for Get, except std::string: use GetStringArray).
  template <typename T>
  absl::StatusOr<std::vector<T>> GetArrayOf(std::string_view key) const {
    absl::StatusOr<const GgufValue*> v = Lookup(key);
    if (!v.ok()) return v.status();
    absl::StatusOr<std::vector<T>> out = (*v)->GetArray<T>();
    if (!out.ok()) return KeyError(key, out.status());
    return out;
  }
  // A view of an array of strings, valid while the file lives.
  absl::StatusOr<absl::Span<const std::string>> GetStringArray(std::string_view key) const;
  // Tolerant: an array of any integer element type, as int64.
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;

  // ---- Tensors ----
  // In file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  // NotFound "<source>: tensor 'name' is missing" when absent.
  absl::StatusOr<const GgufTensorInfo*> GetTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  // Parses bytes_/size_ (already set) and fills everything else.
  absl::Status Parse();
  absl::Status ParseTensorInfo(GgufCursor& cursor, uint64_t index, uint64_t* offset_field_at);
  absl::Status CheckTensorPlacement(const std::vector<uint64_t>& offset_field_at);
  absl::StatusOr<const GgufValue*> Lookup(std::string_view key) const;
  absl::Status KeyError(std::string_view key, const absl::Status& cause) const;

  std::string source_;
  std::unique_ptr<MappedFile> mapping_;        // when opened from a path
  std::unique_ptr<uint8_t[], void (*)(uint8_t*)> owned_{nullptr, nullptr};  // when from bytes
  const uint8_t* bytes_ = nullptr;
  uint64_t size_ = 0;

  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufMetadataEntry> metadata_;
  std::map<std::string, size_t, std::less<>> key_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GGUF_GGUF_FILE_H_
