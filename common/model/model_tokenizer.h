// Reads a model's tokenizer from its GGUF metadata (docs/MODEL.md §7).
#ifndef TANDEM_COMMON_MODEL_MODEL_TOKENIZER_H_
#define TANDEM_COMMON_MODEL_MODEL_TOKENIZER_H_

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// Fills a TokenizerSpec from the tokenizer.ggml.* keys; errors name the key.
absl::StatusOr<TokenizerSpec> ReadTokenizerSpec(const GgufFile& file);
absl::StatusOr<Tokenizer> LoadTokenizer(const GgufFile& file);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_MODEL_TOKENIZER_H_
