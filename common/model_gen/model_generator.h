// Writes a synthetic qwen3next / qwen4exp GGUF file from a GenModelSpec (docs/GEN_MODEL.md).
//
// The file holds the metadata of BuildModelMetadata, the small tokenizer of
// MakeSmallByteLevelTokenizer(spec.vocab), and the tensors of PlanTensors in that order, each drawn
// by FillTensor and written piece by piece, so memory stays at a few MiB per thread whatever the
// model's size. Tensors are drawn by `threads` threads at once (each tensor has its own random
// stream, so the bytes do not depend on the thread count): the file's layout is written first with
// holes, then every thread writes its tensors' pieces at their offsets. The same spec (seed
// included) gives a byte-identical file.
#ifndef TANDEM_COMMON_MODEL_GEN_MODEL_GENERATOR_H_
#define TANDEM_COMMON_MODEL_GEN_MODEL_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/model_gen/model_spec.h"

namespace tandem {

struct GenProgress {
  uint64_t bytes_written = 0;  // tensor data bytes so far
  uint64_t total_bytes = 0;    // tensor data bytes of the whole file
  double seconds = 0;          // since GenerateModel started
  std::string_view tensor;     // the tensor whose piece was just written
  bool done = false;           // the last call: the file is complete and renamed
};
using GenProgressFn = std::function<void(const GenProgress&)>;

// Writes the model to `path` (through a temporary file renamed at the end, so a failed run leaves
// no partial file under `path`). `progress`, when set, is called after every written piece
// (a few MiB; from one thread at a time, bytes_written never decreasing) and once at the end with
// done = true. threads <= 0 means one per hardware thread. Errors: the spec fails
// CheckGenModelSpec, the tokenizer cannot be built, or an I/O error (naming the path).
absl::Status GenerateModel(const GenModelSpec& spec, const std::string& path,
                           const GenProgressFn& progress = nullptr, int threads = 1);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GEN_MODEL_GENERATOR_H_
