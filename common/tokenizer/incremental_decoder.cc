#include "common/tokenizer/incremental_decoder.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {

absl::StatusOr<std::string> IncrementalDecoder::Push(int32_t id) {
  if (!tokenizer_->IsValidId(id)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "token id %d is outside the vocabulary [0, %d)", id, tokenizer_->vocab_size()));
  }
  return sanitizer_.Push(tokenizer_->TokenBytes(id));
}

}  // namespace tandem
