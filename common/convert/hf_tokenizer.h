// The tokenizer of a Hugging Face checkpoint (tokenizer.json, tokenizer_config.json) as GGUF's
// tokenizer.ggml.* data, the way llama.cpp's converter writes a Qwen2-family byte-level BPE:
// tokens in tokenizer.json's byte-level mapped form, ids 0..vocab-1 with "[PAD<id>]" (unused) for
// ids the tokenizer does not define; added tokens as literal text, special -> control, others
// user-defined; merges as "A B"; bos/eos/pad from tokenizer_config.json's *_token (a string or
// {"content": ...}) or else config.json's *_token_id; the chat template from tokenizer_config.json
// or chat_template.jinja.
#ifndef TANDEM_COMMON_CONVERT_HF_TOKENIZER_H_
#define TANDEM_COMMON_CONVERT_HF_TOKENIZER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/convert/hf_config.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// `config` supplies the vocabulary size (the embedding rows) and the config.json id fallbacks.
// Errors name the file and field: a missing tokenizer.json, a model type other than BPE, an id at
// or above vocab_size, a special token that is not in the vocabulary.
absl::StatusOr<TokenizerSpec> ReadHfTokenizer(const std::string& dir, const Qwen3NextHfConfig& config);

}  // namespace tandem

#endif  // TANDEM_COMMON_CONVERT_HF_TOKENIZER_H_
