#include "common/gguf/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_codec.h"
#include "common/weights/weight_types.h"

namespace tandem {
namespace {

constexpr size_t kBufferBytes = 1 << 20;
constexpr uint64_t kMaxKeyBytes = 65535;

uint64_t AlignUp(uint64_t v, uint64_t alignment) { return (v + alignment - 1) / alignment * alignment; }

// Nesting depth of a value: 0 for a scalar or string, 1 for an array of those, ...
int ArrayDepth(const GgufValue& v) {
  if (v.type() != GgufType::kArray) return 0;
  int inner = 0;
  if (v.element_type() == GgufType::kArray) {
    for (uint64_t i = 0; i < v.array_size(); ++i) inner = std::max(inner, ArrayDepth(v.ArrayAt(i)));
  }
  return 1 + inner;
}

absl::Status SystemError(const std::string& path, const char* call, int err) {
  return absl::UnavailableError(absl::StrCat(path, ": ", call, " failed: ", std::strerror(err)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufWriter>> GgufWriter::Create(const std::string& path, GgufWriterOptions options) {
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF writer: alignment ", options.alignment,
                                                   " is not a power of two"));
  }
  if (options.version != 2 && options.version != 3) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF writer: version ", options.version,
                                                   " cannot be written (2 or 3)"));
  }
  std::string temp_path = absl::StrCat(path, ".partial-", ::getpid());
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return SystemError(temp_path, "open", errno);
  return std::unique_ptr<GgufWriter>(new GgufWriter(path, std::move(temp_path), fd, options));
}

GgufWriter::GgufWriter(std::string path, std::string temp_path, int fd, GgufWriterOptions options)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd), options_(options) {
  buffer_.reserve(kBufferBytes);
}

GgufWriter::~GgufWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(temp_path_.c_str());
}

absl::Status GgufWriter::AddMetadata(std::string key, GgufValue value) {
  if (header_written_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": metadata key '", key, "' added after tensor data started"));
  }
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata key of ", key.size(), " bytes (max ",
                                                   kMaxKeyBytes, ")"));
  }
  if (key_index_.count(key) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": duplicate metadata key '", key, "'"));
  }
  if (ArrayDepth(value) > kGgufMaxArrayDepth) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata key '", key, "': arrays nested deeper than ",
                                                   kGgufMaxArrayDepth, " levels"));
  }
  if (key == kGgufAlignmentKey) {
    absl::StatusOr<uint32_t> alignment = value.Get<uint32_t>();
    if (!alignment.ok() || *alignment != options_.alignment) {
      return absl::InvalidArgumentError(absl::StrCat(
          path_, ": general.alignment must be a u32 equal to GgufWriterOptions::alignment (", options_.alignment,
          ")"));
    }
  }
  key_index_.emplace(key, metadata_.size());
  metadata_.emplace_back(std::move(key), std::move(value));
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensor(std::string name, uint32_t ggml_type, absl::Span<const int64_t> ne) {
  const std::string where = absl::StrCat(path_, ": tensor '", name, "'");
  if (header_written_) return absl::FailedPreconditionError(absl::StrCat(where, " added after tensor data started"));
  if (tensor_index_.count(name) != 0) return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate name"));
  const WeightTypeInfo* info = FindWeightTypeInfo(ggml_type);
  if (info == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, ": unknown ggml type id ", ggml_type));
  if (ne.size() > 4) return absl::InvalidArgumentError(absl::StrCat(where, ": ", ne.size(), " dimensions (max 4)"));
  int64_t elements = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": ne[", d, "] = ", ne[d], " is negative"));
    if (__builtin_mul_overflow(elements, ne[d], &elements)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": element count overflows int64"));
    }
  }
  const int64_t ne0 = ne.empty() ? 1 : ne[0];
  if (ne0 % info->block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ne[0] = ", ne0, " is not a multiple of the ",
                                                   std::string(info->name), " block size ", info->block_elems));
  }
  uint64_t bytes = static_cast<uint64_t>(ne0 / info->block_elems) * static_cast<uint64_t>(info->block_bytes);
  for (size_t d = 1; d < ne.size(); ++d) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(ne[d]), &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": byte size overflows 64 bits"));
    }
  }
  PendingTensor t{std::move(name), ggml_type, std::vector<int64_t>(ne.begin(), ne.end()), bytes, next_offset_};
  next_offset_ = AlignUp(next_offset_ + bytes, options_.alignment);
  tensor_index_.emplace(t.name, tensors_.size());
  tensors_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> GgufWriter::TensorBytes(std::string_view name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": tensor '", std::string(name), "' was not declared"));
  }
  return tensors_[it->second].n_bytes;
}

absl::StatusOr<uint64_t> GgufWriter::TensorOffset(std::string_view name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": tensor '", std::string(name), "' was not declared"));
  }
  return tensors_[it->second].offset;
}

absl::Status GgufWriter::WriteHeader() {
  std::string header(kGgufMagic, 4);
  AppendGgufU32(&header, options_.version);
  AppendGgufU64(&header, tensors_.size());
  const bool add_alignment = options_.alignment != kGgufDefaultAlignment && key_index_.count(kGgufAlignmentKey) == 0;
  AppendGgufU64(&header, metadata_.size() + (add_alignment ? 1 : 0));
  if (add_alignment) {
    AppendGgufString(&header, kGgufAlignmentKey);
    AppendGgufTypedValue(&header, GgufValue::Scalar<uint32_t>(options_.alignment));
  }
  for (const auto& [key, value] : metadata_) {
    AppendGgufString(&header, key);
    AppendGgufTypedValue(&header, value);
  }
  for (const PendingTensor& t : tensors_) {
    AppendGgufString(&header, t.name);
    AppendGgufU32(&header, static_cast<uint32_t>(t.ne.size()));
    for (int64_t n : t.ne) AppendGgufU64(&header, static_cast<uint64_t>(n));
    AppendGgufU32(&header, t.ggml_type);
    AppendGgufU64(&header, t.offset);
  }
  header_written_ = true;
  if (absl::Status s = Append(header.data(), header.size()); !s.ok()) return s;
  if (absl::Status s = Pad(); !s.ok()) return s;
  data_offset_ = pos_;
  return absl::OkStatus();
}

absl::StatusOr<GgufWriter::PendingTensor*> GgufWriter::TensorForData(std::string_view name, uint64_t n) {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(path_, ": write after Finish()"));
  if (!failure_.ok()) return failure_;
  if (!header_written_) {
    if (absl::Status s = WriteHeader(); !s.ok()) return s;
  }
  while (current_ < tensors_.size() && tensors_[current_].name != name) {
    const PendingTensor& t = tensors_[current_];
    if (t.written != t.n_bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          path_, ": data for tensor '", std::string(name), "' while tensor '", t.name, "' still lacks ",
          t.n_bytes - t.written, " of its ", t.n_bytes, " bytes (tensors are written in declaration order)"));
    }
    ++current_;
    if (absl::Status s = Pad(); !s.ok()) return s;
  }
  if (current_ == tensors_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": data for tensor '", std::string(name),
                                                      "', which is not declared or was already written"));
  }
  PendingTensor& t = tensors_[current_];
  if (n > t.n_bytes - t.written) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", t.name, "' is given ", n, " more bytes but has ",
                                                   t.n_bytes - t.written, " of its ", t.n_bytes, " left"));
  }
  return &t;
}

absl::Status GgufWriter::WriteTensorData(std::string_view name, absl::Span<const uint8_t> bytes) {
  absl::StatusOr<PendingTensor*> t = TensorForData(name, bytes.size());
  if (!t.ok()) return t.status();
  if (absl::Status s = Append(bytes.data(), bytes.size()); !s.ok()) return s;
  (*t)->written += bytes.size();
  return absl::OkStatus();
}

absl::Status GgufWriter::WriteTensorZeros(std::string_view name, uint64_t n) {
  absl::StatusOr<PendingTensor*> t = TensorForData(name, n);
  if (!t.ok()) return t.status();
  if (absl::Status s = Flush(); !s.ok()) return s;
  if (::lseek(fd_, static_cast<off_t>(n), SEEK_CUR) < 0) return Fail(SystemError(temp_path_, "lseek", errno));
  pos_ += n;
  (*t)->written += n;
  return absl::OkStatus();
}

absl::Status GgufWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(path_, ": Finish() called twice"));
  if (!failure_.ok()) return failure_;
  if (!header_written_) {
    if (absl::Status s = WriteHeader(); !s.ok()) return s;
  }
  for (const PendingTensor& t : tensors_) {
    if (t.written != t.n_bytes) {
      return absl::FailedPreconditionError(absl::StrCat(path_, ": tensor '", t.name, "' received ", t.written,
                                                        " of its ", t.n_bytes, " bytes"));
    }
  }
  if (!tensors_.empty()) {
    if (absl::Status s = Pad(); !s.ok()) return s;
  }
  if (absl::Status s = Flush(); !s.ok()) return s;
  // A trailing WriteTensorZeros only moved the offset: extend the file to its full length.
  if (::ftruncate(fd_, static_cast<off_t>(pos_)) != 0) return Fail(SystemError(temp_path_, "ftruncate", errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return Fail(SystemError(temp_path_, "close", errno));
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) return Fail(SystemError(path_, "rename", errno));
  finished_ = true;
  return absl::OkStatus();
}

absl::Status GgufWriter::Append(const void* data, uint64_t n) {
  if (n >= kBufferBytes) {
    if (absl::Status s = Flush(); !s.ok()) return s;
    const uint8_t* p = static_cast<const uint8_t*>(data);
    uint64_t left = n;
    while (left > 0) {
      const ssize_t w = ::write(fd_, p, std::min<uint64_t>(left, 1u << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Fail(SystemError(temp_path_, "write", errno));
      p += w;
      left -= static_cast<uint64_t>(w);
    }
  } else {
    if (buffer_.size() + n > kBufferBytes) {
      if (absl::Status s = Flush(); !s.ok()) return s;
    }
    const uint8_t* p = static_cast<const uint8_t*>(data);
    buffer_.insert(buffer_.end(), p, p + n);
  }
  pos_ += n;
  return absl::OkStatus();
}

absl::Status GgufWriter::Pad() {
  static constexpr uint8_t kZeros[64] = {};
  uint64_t left = AlignUp(pos_, options_.alignment) - pos_;
  while (left > 0) {
    const uint64_t n = std::min<uint64_t>(left, sizeof(kZeros));
    if (absl::Status s = Append(kZeros, n); !s.ok()) return s;
    left -= n;
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::Flush() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t w = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Fail(SystemError(temp_path_, "write", errno));
    done += static_cast<size_t>(w);
  }
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status GgufWriter::Fail(absl::Status status) {
  failure_ = status;
  return status;
}

}  // namespace tandem
