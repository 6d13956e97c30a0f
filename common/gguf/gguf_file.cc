// GGUF parsing and validation. Layout (ggml's docs/gguf.md), all little-endian:
//   magic "GGUF" | u32 version | u64 tensor_count | u64 metadata_kv_count
//   metadata_kv_count x { string key | u32 value type | value }
//   tensor_count x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml type | u64 offset }
//   zero padding to general.alignment | tensor data (each tensor at data start + offset)
// where a string is a u64 length and that many bytes. Versions 2 and 3 share this layout (v3 only
// added big-endian files, which Tandem refuses); version 1 had u32 counts and lengths.
#include "common/gguf/gguf_file.h"

#include <algorithm>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/gguf/gguf_codec.h"
#include "common/gguf/mapped_file.h"

namespace tandem {
namespace {

// The fewest bytes a metadata entry (8-byte key length, type, 1-byte value) and a tensor info
// (8-byte name length, n_dims, type, offset) can take: lying counts are refused against these.
constexpr uint64_t kMinMetadataEntryBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;
// The spec bounds keys to 65535 bytes.
constexpr uint64_t kMaxKeyBytes = 65535;
constexpr size_t kOwnedAlignment = 4096;

void FreeAligned(uint8_t* p) { ::operator delete[](p, std::align_val_t(kOwnedAlignment)); }

std::string QuoteForMessage(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 80)) {
    if (c >= 0x20 && c < 0x7f) {
      out += c;
    } else {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", static_cast<unsigned char>(c)));
    }
  }
  if (s.size() > 80) out += "...";
  return out + "'";
}

}  // namespace

GgufFile::~GgufFile() = default;

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<MappedFile>> mapping = MappedFile::Open(path);
  if (!mapping.ok()) return mapping.status();
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->source_ = path;
  file->bytes_ = (*mapping)->data();
  file->size_ = (*mapping)->size();
  file->mapping_ = std::move(*mapping);
  if (absl::Status s = file->Parse(); !s.ok()) return s;
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(absl::Span<const uint8_t> bytes, std::string source) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->source_ = std::move(source);
  if (!bytes.empty()) {
    file->owned_ = std::unique_ptr<uint8_t[], void (*)(uint8_t*)>(
        static_cast<uint8_t*>(::operator new[](bytes.size(), std::align_val_t(kOwnedAlignment))), &FreeAligned);
    std::copy(bytes.begin(), bytes.end(), file->owned_.get());
  }
  file->bytes_ = file->owned_.get();
  file->size_ = bytes.size();
  if (absl::Status s = file->Parse(); !s.ok()) return s;
  return file;
}

absl::Status GgufFile::Parse() {
  GgufCursor cursor(bytes_, size_);
  cursor.set_context(absl::StrCat(source_, ": header"));
  const uint8_t* magic = nullptr;
  if (absl::Status s = cursor.ReadBytes("magic", 4, &magic); !s.ok()) return s;
  if (!std::equal(magic, magic + 4, kGgufMagic)) {
    return cursor.Error("magic", 0,
                        absl::StrCat("expected 'GGUF', found ",
                                     QuoteForMessage(std::string_view(reinterpret_cast<const char*>(magic), 4)),
                                     " (not a GGUF file)"));
  }
  if (absl::Status s = cursor.ReadU32("version", &version_); !s.ok()) return s;
  if (version_ == 1) {
    return cursor.Error("version", 4, "GGUF version 1 (32-bit counts) is not supported; re-convert the file");
  }
  if (version_ != 2 && version_ != 3) {
    const bool byte_swapped = (version_ & 0xffff) == 0 && (version_ >> 24) >= 1 && (version_ >> 24) <= 3;
    return cursor.Error("version", 4,
                        byte_swapped ? "the file is big-endian GGUF, which is not supported"
                                     : absl::StrCat("unsupported version ", version_, " (supported: 2, 3)"));
  }
  uint64_t tensor_count = 0;
  uint64_t kv_count = 0;
  if (absl::Status s = cursor.ReadU64("tensor_count", &tensor_count); !s.ok()) return s;
  if (absl::Status s = cursor.ReadU64("metadata_kv_count", &kv_count); !s.ok()) return s;
  if (kv_count > cursor.remaining() / kMinMetadataEntryBytes) {
    return cursor.Error("metadata_kv_count", 16,
                        absl::StrCat(kv_count, " entries cannot fit in the ", cursor.remaining(), " bytes left"));
  }
  if (tensor_count > (cursor.remaining() - kv_count * kMinMetadataEntryBytes) / kMinTensorInfoBytes) {
    return cursor.Error("tensor_count", 8,
                        absl::StrCat(tensor_count, " tensor infos cannot fit in the ", cursor.remaining(),
                                     " bytes left after ", kv_count, " metadata entries"));
  }

  metadata_.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    GgufMetadataEntry entry;
    entry.offset = cursor.pos();
    cursor.set_context(absl::StrCat(source_, ": metadata entry ", i));
    if (absl::Status s = cursor.ReadString("key", &entry.key); !s.ok()) return s;
    if (entry.key.size() > kMaxKeyBytes) {
      return cursor.Error("key length", entry.offset,
                          absl::StrCat(entry.key.size(), " bytes (the format allows ", kMaxKeyBytes, ")"));
    }
    cursor.set_context(absl::StrCat(source_, ": metadata key ", QuoteForMessage(entry.key), " (entry ", i, ")"));
    if (auto it = key_index_.find(entry.key); it != key_index_.end()) {
      return cursor.Error("key", entry.offset,
                          absl::StrCat("duplicate key (first at byte ", metadata_[it->second].offset, ")"));
    }
    const uint64_t type_at = cursor.pos();
    uint32_t type = 0;
    if (absl::Status s = cursor.ReadU32("value type", &type); !s.ok()) return s;
    if (!IsValidGgufType(type)) {
      return cursor.Error("value type", type_at, absl::StrCat("unknown value type id ", type));
    }
    if (absl::Status s = cursor.ReadValue(static_cast<GgufType>(type), 0, &entry.value); !s.ok()) return s;
    if (entry.key == kGgufAlignmentKey) {
      absl::StatusOr<uint32_t> alignment = entry.value.Get<uint32_t>();
      if (!alignment.ok()) return cursor.Error("value type", type_at, std::string(alignment.status().message()));
      if (*alignment == 0 || (*alignment & (*alignment - 1)) != 0) {
        return cursor.Error("value", type_at + 4, absl::StrCat(*alignment, " is not a power of two"));
      }
      alignment_ = *alignment;
    }
    key_index_.emplace(entry.key, metadata_.size());
    metadata_.push_back(std::move(entry));
  }

  tensors_.reserve(tensor_count);
  std::vector<uint64_t> offset_field_at(tensor_count);  // where each tensor's offset field is
  for (uint64_t i = 0; i < tensor_count; ++i) {
    if (absl::Status s = ParseTensorInfo(cursor, i, &offset_field_at[i]); !s.ok()) return s;
  }
  // The data section starts at the next multiple of the alignment (cannot overflow: the position
  // is at most the file size and the alignment at most 2^31).
  data_offset_ = (cursor.pos() + alignment_ - 1) / alignment_ * alignment_;
  return CheckTensorPlacement(offset_field_at);
}

absl::Status GgufFile::ParseTensorInfo(GgufCursor& cursor, uint64_t index, uint64_t* offset_field_at) {
  GgufTensorInfo t;
  t.info_offset = cursor.pos();
  cursor.set_context(absl::StrCat(source_, ": tensor info ", index));
  if (absl::Status s = cursor.ReadString("name", &t.name); !s.ok()) return s;
  cursor.set_context(absl::StrCat(source_, ": tensor ", QuoteForMessage(t.name), " (info ", index, ")"));
  if (auto it = tensor_index_.find(t.name); it != tensor_index_.end()) {
    return cursor.Error("name", t.info_offset,
                        absl::StrCat("duplicate tensor name (first at byte ", tensors_[it->second].info_offset, ")"));
  }
  const uint64_t dims_at = cursor.pos();
  uint32_t n_dims = 0;
  if (absl::Status s = cursor.ReadU32("n_dims", &n_dims); !s.ok()) return s;
  if (n_dims > kGgufMaxDims) {
    return cursor.Error("n_dims", dims_at, absl::StrCat(n_dims, " dimensions (at most ", kGgufMaxDims, ")"));
  }
  t.n_dims = static_cast<int>(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t at = cursor.pos();
    const std::string field = absl::StrCat("ne[", d, "]");
    uint64_t ne = 0;
    if (absl::Status s = cursor.ReadU64(field, &ne); !s.ok()) return s;
    if (ne > static_cast<uint64_t>(INT64_MAX)) {
      return cursor.Error(field, at, absl::StrCat(ne, " is larger than int64 allows"));
    }
    t.ne[d] = static_cast<int64_t>(ne);
  }
  const uint64_t type_at = cursor.pos();
  if (absl::Status s = cursor.ReadU32("type", &t.ggml_type); !s.ok()) return s;
  t.type_info = FindWeightTypeInfo(t.ggml_type);
  if (t.type_info == nullptr) {
    return cursor.Error("type", type_at, absl::StrCat("unknown ggml type id ", t.ggml_type));
  }
  const uint64_t offset_at = cursor.pos();
  *offset_field_at = offset_at;
  if (absl::Status s = cursor.ReadU64("offset", &t.offset); !s.ok()) return s;

  // Element count and byte size, refusing overflow (ggml's ggml_nbytes for a contiguous tensor).
  int64_t elements = 1;
  for (int d = 0; d < kGgufMaxDims; ++d) {
    if (__builtin_mul_overflow(elements, t.ne[d], &elements)) {
      return cursor.Error("ne", dims_at + 4, "the shape's element count overflows int64");
    }
  }
  t.n_elements = elements;
  const WeightTypeInfo& info = *t.type_info;
  if (t.ne[0] % info.block_elems != 0) {
    return cursor.Error("ne[0]", dims_at + 4,
                        absl::StrCat(t.ne[0], " is not a multiple of the ", std::string(info.name), " block size ",
                                     info.block_elems));
  }
  uint64_t bytes = static_cast<uint64_t>(t.ne[0] / info.block_elems) * static_cast<uint64_t>(info.block_bytes);
  for (int d = 1; d < kGgufMaxDims; ++d) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(t.ne[d]), &bytes)) {
      return cursor.Error("ne", dims_at + 4, "the tensor's byte size overflows 64 bits");
    }
  }
  t.n_bytes = bytes;
  if (t.offset % alignment_ != 0) {
    return cursor.Error("offset", offset_at,
                        absl::StrCat(t.offset, " is not a multiple of the alignment ", alignment_));
  }
  tensor_index_.emplace(t.name, tensors_.size());
  tensors_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status GgufFile::CheckTensorPlacement(const std::vector<uint64_t>& offset_field_at) {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensorInfo& t = tensors_[i];
    // Checked even for empty tensors, whose view must still point inside (or just past) the file.
    const bool inside = data_offset_ <= size_ && t.offset <= size_ - data_offset_ &&
                        t.n_bytes <= size_ - data_offset_ - t.offset;
    if (!inside) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": tensor ", QuoteForMessage(t.name), " (info ", i, "): offset at byte ", offset_field_at[i],
          ": data [", t.offset, ", +", t.n_bytes, ") runs past the end of the file (data section starts at byte ",
          data_offset_, ", file is ", size_, " bytes)"));
    }
    t.file_offset = data_offset_ + t.offset;
    t.data = absl::Span<const uint8_t>(bytes_ + t.file_offset, t.n_bytes);
  }
  // No two tensors may share bytes: sort by offset and compare neighbours (empty tensors take none).
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  const GgufTensorInfo* previous = nullptr;
  for (size_t i : order) {
    const GgufTensorInfo& t = tensors_[i];
    if (t.n_bytes == 0) continue;
    if (previous != nullptr && previous->offset + previous->n_bytes > t.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": tensor ", QuoteForMessage(t.name), " (info ", i, "): offset at byte ", offset_field_at[i],
          ": data [", t.offset, ", +", t.n_bytes, ") overlaps tensor ", QuoteForMessage(previous->name),
          " [", previous->offset, ", +", previous->n_bytes, ")"));
    }
    previous = &t;
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::FindValue(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

absl::StatusOr<const GgufValue*> GgufFile::Lookup(std::string_view key) const {
  const GgufValue* v = FindValue(key);
  if (v == nullptr) {
    return absl::NotFoundError(absl::StrCat(source_, ": metadata key '", std::string(key), "' is missing"));
  }
  return v;
}

absl::Status GgufFile::KeyError(std::string_view key, const absl::Status& cause) const {
  return absl::Status(cause.code(),
                      absl::StrCat(source_, ": metadata key '", std::string(key), "': ", cause.message()));
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key, int64_t min, int64_t max) const {
  absl::StatusOr<const GgufValue*> v = Lookup(key);
  if (!v.ok()) return v.status();
  absl::StatusOr<int64_t> out = (*v)->ToInt();
  if (!out.ok()) return KeyError(key, out.status());
  if (*out < min || *out > max) {
    return KeyError(key, absl::OutOfRangeError(absl::StrCat(GgufTypeName((*v)->type()), " value ", *out,
                                                            " is outside [", min, ", ", max, "]")));
  }
  return out;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Lookup(key);
  if (!v.ok()) return v.status();
  absl::StatusOr<double> out = (*v)->ToFloat();
  if (!out.ok()) return KeyError(key, out.status());
  return out;
}

absl::StatusOr<const GgufValue*> GgufFile::GetArray(std::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Lookup(key);
  if (!v.ok()) return v.status();
  if ((*v)->type() != GgufType::kArray) {
    return KeyError(key, absl::FailedPreconditionError(
                             absl::StrCat("expected an array, found ", GgufTypeName((*v)->type()))));
  }
  return v;
}

absl::StatusOr<absl::Span<const std::string>> GgufFile::GetStringArray(std::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Lookup(key);
  if (!v.ok()) return v.status();
  absl::StatusOr<absl::Span<const std::string>> out = (*v)->GetStringArray();
  if (!out.ok()) return KeyError(key, out.status());
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Lookup(key);
  if (!v.ok()) return v.status();
  absl::StatusOr<std::vector<int64_t>> out = (*v)->ToIntArray();
  if (!out.ok()) return KeyError(key, out.status());
  return out;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<const GgufTensorInfo*> GgufFile::GetTensor(std::string_view name) const {
  const GgufTensorInfo* t = FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(source_, ": tensor '", std::string(name), "' is missing"));
  return t;
}

}  // namespace tandem
