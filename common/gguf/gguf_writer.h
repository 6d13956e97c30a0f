// A streaming GGUF writer: declare everything, then stream each tensor's bytes in order.
//
//   auto w = GgufWriter::Create("model.gguf");            // writes "model.gguf.partial-<pid>"
//   (*w)->AddMetadata("general.architecture", GgufValue::String("qwen3next"));
//   (*w)->AddTensor("token_embd.weight", /*ggml_type=*/12, {2048, 151936});
//   (*w)->WriteTensorData("token_embd.weight", piece1);  // any number of pieces per tensor
//   (*w)->WriteTensorData("token_embd.weight", piece2);
//   (*w)->Finish();                                        // checks, then renames to model.gguf
//
// Only the header (metadata and tensor infos) is held in memory; tensor bytes go straight to the
// file through a 1 MiB buffer, so files far above 4 GiB are written in constant memory. Offsets
// are 64-bit throughout. The header is written at the first WriteTensorData/WriteTensorZeros (or at
// Finish); after that nothing more can be declared. Tensors are written in declaration order, each
// receiving exactly its byte count (from the ggml type table), each padded with zeros to the
// alignment. A writer destroyed without a successful Finish() deletes its temporary file, so a
// failed run never leaves a truncated file under the final name (the file is not fsynced: a power
// loss right after Finish() may still lose it). Not thread-safe.
#ifndef TANDEM_COMMON_GGUF_GGUF_WRITER_H_
#define TANDEM_COMMON_GGUF_GGUF_WRITER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_value.h"

namespace tandem {

struct GgufWriterOptions {
  // Power of two. When not 32 (GGUF's default) the writer stores it as general.alignment (u32).
  uint32_t alignment = 32;
  // 3 (current) or 2: the layouts are identical; 2 exists for compatibility tests.
  uint32_t version = 3;
};

class GgufWriter {
 public:
  // Opens `path`.partial-<pid> for writing (O_EXCL). Errors: bad options, or the file cannot be made.
  static absl::StatusOr<std::unique_ptr<GgufWriter>> Create(const std::string& path,
                                                            GgufWriterOptions options = {});
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;
  // Closes the file; deletes the temporary file unless Finish() succeeded.
  ~GgufWriter();

  // ---- Declaration (before any data) ----
  // Keys are unique and at most 65535 bytes; arrays nest at most 8 deep. general.alignment may be
  // given only as a u32 equal to options.alignment (it is written once either way).
  absl::Status AddMetadata(std::string key, GgufValue value);
  // ne in ggml order (ne[0] innermost), 0..4 dimensions, each >= 0, ne[0] a whole number of blocks
  // of the type. The type must be in the ggml type table (supported by Tandem or not).
  absl::Status AddTensor(std::string name, uint32_t ggml_type, absl::Span<const int64_t> ne);
  absl::Status AddTensor(std::string name, uint32_t ggml_type, std::initializer_list<int64_t> ne) {
    return AddTensor(std::move(name), ggml_type, absl::Span<const int64_t>(ne.begin(), ne.size()));
  }
  // Byte size and data-section offset of a declared tensor (NotFound if not declared).
  absl::StatusOr<uint64_t> TensorBytes(std::string_view name) const;
  absl::StatusOr<uint64_t> TensorOffset(std::string_view name) const;

  // ---- Data ----
  // Appends `bytes` to tensor `name`, which must be the first tensor (in declaration order) that
  // has not yet received all its bytes; more bytes than it has left is an error.
  absl::Status WriteTensorData(std::string_view name, absl::Span<const uint8_t> bytes);
  // Appends n zero bytes to tensor `name` (same rules) by seeking, leaving a hole on filesystems
  // that support sparse files: zero-initialised tensors of any size cost no disk or time.
  absl::Status WriteTensorZeros(std::string_view name, uint64_t n);

  // Writes the header if not yet written, checks that every tensor received exactly its byte
  // count, flushes, closes and renames the file to its final path. Nothing may follow.
  absl::Status Finish();

  const std::string& path() const { return path_; }
  uint64_t data_offset() const { return data_offset_; }  // valid once the header is written

 private:
  struct PendingTensor {
    std::string name;
    uint32_t ggml_type;
    std::vector<int64_t> ne;
    uint64_t n_bytes;
    uint64_t offset;  // relative to the data section
    uint64_t written = 0;
  };

  GgufWriter(std::string path, std::string temp_path, int fd, GgufWriterOptions options);
  absl::Status WriteHeader();
  // Checks order and size for `n` bytes to `name`, advancing past finished tensors; returns the
  // tensor to receive them.
  absl::StatusOr<PendingTensor*> TensorForData(std::string_view name, uint64_t n);
  absl::Status Append(const void* data, uint64_t n);
  absl::Status Pad();
  absl::Status Flush();
  absl::Status Fail(absl::Status status);

  std::string path_;
  std::string temp_path_;
  int fd_;
  GgufWriterOptions options_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t, std::less<>> key_index_;
  std::vector<PendingTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  uint64_t next_offset_ = 0;      // data-section offset for the next declared tensor
  bool header_written_ = false;
  bool finished_ = false;
  absl::Status failure_;          // sticky: an I/O error leaves the file unusable
  uint64_t data_offset_ = 0;
  size_t current_ = 0;            // first tensor that may still receive bytes
  uint64_t pos_ = 0;              // logical file position (buffer included)
  std::vector<uint8_t> buffer_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GGUF_GGUF_WRITER_H_
