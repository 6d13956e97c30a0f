// A read-only memory mapping of a whole file, owned by RAII (unmapped and closed on destruction).
#ifndef TANDEM_COMMON_GGUF_MAPPED_FILE_H_
#define TANDEM_COMMON_GGUF_MAPPED_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

class MappedFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE). An empty file maps to data() == nullptr, size() == 0.
  // Errors name the path and the failing system call with errno's text.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, uint64_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_;
  uint64_t size_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GGUF_MAPPED_FILE_H_
