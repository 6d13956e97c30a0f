// Reading Hugging Face safetensors checkpoints (one file, or shards listed by
// model.safetensors.index.json), memory-mapped and bounds-checked.
//
// The format: an 8-byte little-endian header length n, then n bytes of JSON mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the byte after the
// header; "__metadata__" is skipped), then the raw row-major little-endian data. Every tensor's
// byte range is checked against its dtype and shape and against the file size when the file is
// opened, so a truncated or inconsistent file fails at open with the tensor's name and offsets,
// never later with a bad read.
#ifndef TANDEM_COMMON_CONVERT_SAFETENSORS_H_
#define TANDEM_COMMON_CONVERT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/gguf/mapped_file.h"

namespace tandem {

// The element types Tandem reads; others ("I64", "F8_E4M3", ...) are listed but cannot be read.
enum class StDtype { kF32, kF16, kBF16, kOther };

struct StTensor {
  std::string name;
  std::string dtype_name;          // as in the header: "BF16", "F32", ...
  StDtype dtype = StDtype::kOther;
  std::vector<int64_t> shape;      // PyTorch order (outermost first)
  absl::Span<const uint8_t> data;  // inside the file's mapping
  const std::string* file = nullptr;  // the shard's path (for messages)

  int64_t elements() const;
};

class SafetensorsFile {
 public:
  // Maps and validates one .safetensors file.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const { return mapping_->path(); }
  const std::map<std::string, StTensor>& tensors() const { return tensors_; }

 private:
  explicit SafetensorsFile(std::unique_ptr<MappedFile> mapping) : mapping_(std::move(mapping)) {}
  std::unique_ptr<MappedFile> mapping_;
  std::map<std::string, StTensor> tensors_;
};

// All tensors of a checkpoint directory: model.safetensors.index.json's shards when the index
// exists (every shard it names must exist and hold the tensors it says), else every *.safetensors
// file in the directory. A tensor name found in two files is an error.
class SafetensorsCheckpoint {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);

  // nullptr when absent.
  const StTensor* Find(const std::string& name) const;
  const std::map<std::string, const StTensor*>& tensors() const { return index_; }

  // The tensor's elements as f32 (F32, F16 and BF16 are converted exactly). Errors: NotFound
  // naming the tensor; InvalidArgument when its shape is not `expected_shape` (when non-empty) or
  // its dtype cannot be read.
  absl::StatusOr<std::vector<float>> ReadF32(const std::string& name,
                                             const std::vector<int64_t>& expected_shape) const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const StTensor*> index_;
};

// "[a, b, c]".
std::string ShapeToString(const std::vector<int64_t>& shape);

}  // namespace tandem

#endif  // TANDEM_COMMON_CONVERT_SAFETENSORS_H_
