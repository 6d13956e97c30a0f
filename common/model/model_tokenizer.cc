#include "common/model/model_tokenizer.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<TokenizerSpec> ReadTokenizerSpec(const GgufFile& file) {
  TokenizerSpec spec;
  absl::StatusOr<std::string> model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  spec.model = *model;
  spec.pre = file.GetString("tokenizer.ggml.pre").value_or("");
  absl::StatusOr<absl::Span<const std::string>> tokens = file.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  spec.tokens.assign(tokens->begin(), tokens->end());
  if (file.HasKey("tokenizer.ggml.merges")) {
    absl::StatusOr<absl::Span<const std::string>> merges =
        file.GetStringArray("tokenizer.ggml.merges");
    if (!merges.ok()) return merges.status();
    spec.merges.assign(merges->begin(), merges->end());
  }
  if (file.HasKey("tokenizer.ggml.token_type")) {
    absl::StatusOr<std::vector<int64_t>> types = file.GetIntArray("tokenizer.ggml.token_type");
    if (!types.ok()) return types.status();
    spec.token_types.assign(types->begin(), types->end());
  }
  auto optional_id = [&](const char* key, std::optional<int32_t>* out) -> absl::Status {
    if (!file.HasKey(key)) return absl::OkStatus();
    absl::StatusOr<int64_t> id = file.GetInt(key, 0, INT32_MAX);
    if (!id.ok()) return id.status();
    *out = static_cast<int32_t>(*id);
    return absl::OkStatus();
  };
  if (absl::Status s = optional_id("tokenizer.ggml.bos_token_id", &spec.bos_id); !s.ok()) return s;
  if (absl::Status s = optional_id("tokenizer.ggml.eos_token_id", &spec.eos_id); !s.ok()) return s;
  if (absl::Status s = optional_id("tokenizer.ggml.padding_token_id", &spec.pad_id); !s.ok()) return s;
  spec.chat_template = file.GetString("tokenizer.chat_template").value_or("");
  return spec;
}

absl::StatusOr<Tokenizer> LoadTokenizer(const GgufFile& file) {
  absl::StatusOr<TokenizerSpec> spec = ReadTokenizerSpec(file);
  if (!spec.ok()) return spec.status();
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Create(*std::move(spec));
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(file.source(), ": tokenizer: ", tokenizer.status().message()));
  }
  return tokenizer;
}

}  // namespace tandem
